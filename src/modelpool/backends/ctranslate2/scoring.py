"""Prompt-token log-probabilities from one CTranslate2 forward pass.

`score_batch` gives only each token's own log-probability; the API also wants the top
alternatives and whether each token was the greedy choice, which need the whole
distribution at every position: `forward_batch` returns it (positions × vocabulary floats,
~200 KB per token for a 49k vocabulary, freed when scoring ends)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.textgen.logprobs import best, decoded, entry, log_softmax
from modelpool.inference import TokenLogprob


def score_tokens(generator: Any, tokenizer: Any, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    spell = decoded(tokenizer)
    scored = [entry(tokens[0], None, spell(tokens[0]))]
    if len(tokens) == 1:
        return scored
    logits = _logits(generator, tokens[:-1])
    for position, token in enumerate(tokens[1:]):
        row = logits[position]
        logprobs = log_softmax(row)
        greedy = int(np.argmax(row)) == token
        scored.append(entry(token, float(logprobs[token]), spell(token), best(logprobs, top_n), spell, greedy=greedy))
    return scored


def _logits(generator: Any, tokens: list[int]) -> npt.NDArray[np.float32]:
    """[position, vocabulary] logits for the next token after each prefix of `tokens`."""
    import ctranslate2

    view = generator.forward_batch([tokens])
    if view.device != "cpu":
        view = view.to_device(ctranslate2.Device.cpu)
    if view.dtype != ctranslate2.DataType.float32:
        view = view.to(ctranslate2.DataType.float32)
    logits: npt.NDArray[np.float32] = np.asarray(view)[0]
    return logits
