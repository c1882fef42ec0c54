"""The transformers engine's oneDNN-packed linears against `nn.Linear` on random inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from modelpool.backends.transformers.packed_linear import PackedLinear, can_pack, pack_linears  # noqa: E402

pytestmark = pytest.mark.skipif(not torch._C._has_mkldnn, reason="this PyTorch build has no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 576), (16, 576), (3, 7, 576)])
def test_a_packed_linear_equals_nn_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536, bias=bias)
    x = torch.randn(*shape)
    expected, got = linear(x), PackedLinear(linear)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_a_row_gives_the_same_result_whatever_the_batch_size() -> None:
    """What keeps a sequence's greedy tokens independent of its neighbours in the batch."""
    torch.manual_seed(1)
    packed = PackedLinear(nn.Linear(576, 1536, bias=False))
    x = torch.randn(32, 576)
    whole = packed(x)
    for rows in (1, 5, 16):
        assert torch.equal(packed(x[:rows]), whole[:rows])


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 100, bias=False)
        self.head.weight = self.embed.weight
        self.adapted = Adapted(8, 8)


class Adapted(nn.Linear):
    """A subclass (as an adapter or quantised layer would be): it keeps its own forward."""


def test_pack_linears_replaces_plain_linears_and_counts_the_tied_head() -> None:
    torch.manual_seed(2)
    model = Tied().eval()
    x = torch.randn(4, 8)
    expected = (model.body(x), model.head(x))
    assert can_pack(model) is None
    extra = pack_linears(model)
    assert extra == 100 * 8 * 4  # only the head shares its weight (with the embedding)
    assert isinstance(model.body[0], PackedLinear) and isinstance(model.head, PackedLinear)
    assert type(model.adapted) is Adapted
    torch.testing.assert_close((model.body(x), model.head(x)), expected, rtol=1e-5, atol=1e-5)


def test_only_float32_weights_on_the_cpu_are_packed() -> None:
    assert "bfloat16" in (can_pack(nn.Linear(4, 4).to(torch.bfloat16)) or "")
