"""The transformers engine's oneDNN-packed linears against `nn.Linear` on random inputs."""

from __future__ import annotations

from typing import Any

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


@pytest.mark.parametrize("features", [(576, 1536), (1536, 576), (576, 49152)])
def test_a_row_gives_the_same_result_in_any_batch_of_two_or_more(features: tuple[int, int]) -> None:
    """SmolLM2-135M's real shapes (up, down, LM head). From 2 rows up a row's numbers do not
    depend on its neighbours; a lone row may take another kernel path (the 1536-wide down
    projection: ~2e-6 off), so the claim is only closeness there (docs/engines.md)."""
    torch.manual_seed(1)
    packed = PackedLinear(nn.Linear(*features, bias=False))
    x = torch.randn(32, features[0])
    whole = packed(x)
    for rows in (2, 16):
        assert torch.equal(packed(x[:rows]), whole[:rows])
    torch.testing.assert_close(packed(x[:1]), whole[:1], rtol=0, atol=1e-5)


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


@pytest.mark.parametrize(
    ("penalties", "seen", "generated"),
    [({}, 0, 0), ({"repetition_penalty": 1.3}, 5, 0), ({"presence_penalty": 0.5}, 0, 2),
     ({"frequency_penalty": 0.5, "repetition_penalty": 0.9}, 5, 2)],
)  # fmt: skip
def test_penalty_ids_are_built_for_the_penalties_a_sequence_uses(
    penalties: dict[str, Any], seen: int, generated: int
) -> None:
    """The engine's per-step id tensors; choose_token skips a penalty on an empty one."""
    from dataclasses import replace
    from types import SimpleNamespace

    from modelpool.backends.transformers.engine import ContinuousBatcher
    from modelpool.backends.transformers.sampling import choose_token
    from modelpool.inference import SamplingParams

    params = replace(SamplingParams(temperature=0), **penalties)
    seq = SimpleNamespace(sampling=params, prompt=[3, 4, 5], tokens=[7, 3])
    engine = SimpleNamespace(device=torch.device("cpu"), _NO_IDS=ContinuousBatcher._NO_IDS)
    got_seen, got_generated = ContinuousBatcher._penalty_ids(engine, seq)  # type: ignore[arg-type]
    assert (got_seen.numel(), got_generated.numel()) == (seen, generated)
    # against the tensors the engine built before, whatever the penalties
    full_seen, full_generated = torch.tensor([3, 4, 5, 7, 3]), torch.tensor([7, 3])
    logits = torch.randn(16, generator=torch.Generator().manual_seed(3))
    rng = torch.Generator()
    assert choose_token(logits, params, got_seen, got_generated, rng) == choose_token(
        logits, params, full_seen, full_generated, rng
    )
