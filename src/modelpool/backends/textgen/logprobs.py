"""Log-probability entries, assembled one way for every engine: the chosen (or scored)
token with its text and bytes, and its top alternatives best first. An engine computes
the numbers however it can (numpy over a logits buffer, torch, the values CT2 returns)
and says how a token id is spelled."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.inference import TokenLogprob, TopLogprob

PieceOf = Callable[[int], bytes]
"""A token id's bytes as the engine spells it (a GGUF piece, a tokenizer's decode)."""


def log_softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum())
    return result


def best(logprobs: npt.NDArray[np.float64], top_n: int) -> list[tuple[int, float]]:
    """The `top_n` most likely (token id, log-probability), best first."""
    if not top_n:
        return []
    ids = np.argpartition(-logprobs, top_n)[:top_n]
    ids = ids[np.argsort(-logprobs[ids])]
    return [(int(t), float(logprobs[t])) for t in ids]


def entry(
    token: int,
    logprob: float | None,
    piece: bytes,
    top: Iterable[tuple[int, float]] = (),
    top_piece: PieceOf | None = None,
    *,
    greedy: bool = True,
) -> TokenLogprob:
    """One token's entry; its alternatives spelled by `top_piece` (control tokens shown)."""
    alternatives = () if top_piece is None else tuple(_alternative(top_piece(t), lp) for t, lp in top)
    return TokenLogprob(_text(piece), logprob, tuple(piece), alternatives, greedy=greedy, token_id=token)


def decoded(tokenizer: Any) -> PieceOf:
    """A Hugging Face tokenizer's spelling of one token (its decode, as bytes)."""
    return lambda token: str(tokenizer.decode([token])).encode()


def _alternative(piece: bytes, logprob: float) -> TopLogprob:
    return TopLogprob(_text(piece), logprob, tuple(piece))


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")
