"""vLLM's prompt logprobs as modelpool's token scores (the /loglikelihood and `echo` paths)."""

from __future__ import annotations

from typing import Any

from modelpool.backends.textgen.logprobs import PieceOf, entry
from modelpool.inference import TokenLogprob


def scored_tokens(tokens: list[int], positions: list[dict[int, Any] | None], top_n: int,
                  spell: PieceOf) -> list[TokenLogprob]:  # fmt: skip
    """Each token's entry from vLLM's per-position `{token id: Logprob}` maps, which hold the
    prompt's own token and the `top_n` best, each with its rank (1: the greedy choice)."""
    scored = [entry(tokens[0], None, spell(tokens[0]))]
    for token, position in zip(tokens[1:], positions[1:], strict=True):
        found = (position or {}).get(token)
        if found is None:
            raise ValueError(f"vLLM's prompt logprobs lack token {token} at its position")
        ranked = sorted((item for item in (position or {}).items() if item[1].rank is not None),
                        key=lambda item: item[1].rank)  # fmt: skip
        top = [(alternative, float(logprob.logprob)) for alternative, logprob in ranked[:top_n]]
        scored.append(entry(token, float(found.logprob), spell(token), top, spell, greedy=found.rank == 1))
    return scored
