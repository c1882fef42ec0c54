"""Prompt-token log-probabilities from one forward pass (runs on the engine thread)."""

from __future__ import annotations

from typing import Any

import torch

from modelpool.backends.textgen.logprobs import decoded, entry
from modelpool.backends.transformers.sequence import best_of
from modelpool.inference import TokenLogprob


def score_tokens(model: Any, tokenizer: Any, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    spell = decoded(tokenizer)
    scored = [entry(tokens[0], None, spell(tokens[0]))]
    for position in range(1, len(tokens)):
        row = logprobs[position - 1]
        token = tokens[position]
        greedy = int(torch.argmax(logits[position - 1])) == token
        scored.append(entry(token, float(row[token]), spell(token), best_of(row, top_n), spell, greedy=greedy))
    return scored
