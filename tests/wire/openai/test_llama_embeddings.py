"""llama-server's `embd_normalize` p-norms (`/embedding`), on vectors where the arithmetic is delicate."""

from __future__ import annotations

import numpy as np
import pytest

from modelpool.wire.openai.llama_embeddings import MAX_NORM_P, normalised


@pytest.mark.parametrize("p", [2, 7, 40, MAX_NORM_P])
def test_a_p_norm_of_small_components_does_not_underflow_to_zero(p: int) -> None:
    """(1e-6)**64 is below the smallest float64: summed unscaled, the norm was 0 and the vector all zeros."""
    vector = np.array([[1e-6, -2e-6, 5e-7]], dtype=np.float32)
    out = normalised(vector, p)
    assert np.all(np.sign(out) == np.sign(vector))
    assert float(np.sum(np.abs(out.astype(np.float64)) ** p) ** (1.0 / p)) == pytest.approx(1.0, rel=1e-5)


def test_a_zero_vector_stays_zero_under_every_norm() -> None:
    zero = np.zeros((1, 4), dtype=np.float32)
    for p in (0, 1, 2, MAX_NORM_P):
        assert not normalised(zero, p).any()
