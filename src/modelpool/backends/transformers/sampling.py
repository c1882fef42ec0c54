"""Per-sequence sampling: each request keeps its own settings and its own random generator,
so a seeded request gives the same tokens alone or inside a busy batch."""

from __future__ import annotations

import torch

from modelpool.inference import SamplingParams


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def choose_token(
    logits: torch.Tensor,
    params: SamplingParams,
    seen: torch.Tensor,
    generated: torch.Tensor,
    generator: torch.Generator,
    *,
    banned: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> int:
    """One token from one row of logits. `seen` = prompt + generated ids (repetition
    penalty), `generated` = generated ids only (presence/frequency penalties), `banned` =
    ids that must not come now (end-of-sequence under ignore_eos / min_tokens), `allowed` =
    a boolean mask of the only ids that may come (a grammar's)."""
    scores = logits.float().clone()
    if banned is not None:
        scores[banned] = float("-inf")
    if allowed is not None:
        scores[~allowed] = float("-inf")
    if params.repetition_penalty != 1.0 and seen.numel():
        picked = scores[seen]
        scores[seen] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and generated.numel():
        counts = torch.bincount(generated, minlength=scores.numel()).float()
        scores -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    if params.temperature == 0:
        return int(torch.argmax(scores))
    scores = scores / params.temperature
    if params.top_k and params.top_k < scores.numel():
        threshold = torch.topk(scores, params.top_k).values[-1]
        scores[scores < threshold] = float("-inf")
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(ordered, dim=-1) - ordered > params.top_p
        ordered[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, ordered)
    if params.min_p > 0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
