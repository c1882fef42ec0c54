"""Prompt-token log-probabilities from one forward pass (runs on the engine thread)."""

from __future__ import annotations

from typing import Any

import torch

from modelpool.inference import TokenLogprob, TopLogprob


def score_tokens(model: Any, tokenizer: Any, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    scored = [_entry(tokenizer, tokens[0], None, ())]
    for position in range(1, len(tokens)):
        row = logprobs[position - 1]
        token = tokens[position]
        top: tuple[TopLogprob, ...] = ()
        if top_n:
            values, indices = torch.topk(row, top_n)
            top = tuple(_top(tokenizer, int(i), float(v)) for v, i in zip(values, indices, strict=True))
        greedy = int(torch.argmax(logits[position - 1])) == token
        scored.append(_entry(tokenizer, token, float(row[token]), top, greedy))
    return scored


def _entry(
    tokenizer: Any, token: int, logprob: float | None, top: tuple[TopLogprob, ...], greedy: bool = True
) -> TokenLogprob:
    text = tokenizer.decode([token])
    return TokenLogprob(text, logprob, tuple(text.encode()), top, greedy=greedy, token_id=token)


def _top(tokenizer: Any, token: int, logprob: float) -> TopLogprob:
    text = tokenizer.decode([token])
    return TopLogprob(text, logprob, tuple(text.encode()))
