"""Beam search on transformers: the library's own `generate(num_beams=N, do_sample=False)`,
run on the engine thread between two batch steps (so the model is never used by two
threads at once; the batch's streams wait while it runs, the event loop never does).

The answer is known whole at the end: its tokens are replayed through the request's
sequence, which gives stops, `max_tokens`, text and usage exactly as for a streamed one.
A client that leaves stops the search at its next step (a stopping criterion reads the
sequence's cancellation)."""

from __future__ import annotations

from typing import Any

import torch

from modelpool.backends.textgen.step_failure import sequence_failed
from modelpool.backends.transformers.sequence import Sequence
from modelpool.errors import InvalidRequest
from modelpool.inference import BeamSearch, SamplingParams


def check_beam_sampling(params: SamplingParams, model_id: str) -> None:
    """What transformers' beam search has no equivalent for is a 400 naming the field."""
    unsupported = {"presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty}
    for field, value in unsupported.items():
        if value:
            raise InvalidRequest(f"model '{model_id}' (transformers) has no {field} in beam search", param=field)


def beam_options(params: SamplingParams, beam: BeamSearch, max_new: int, end_ids: list[int]) -> dict[str, Any]:
    """`generate`'s arguments for this request (besides the prompt): a test runs transformers
    directly with the same ones and compares."""
    floor = max_new if params.ignore_eos else min(params.min_tokens, max_new)
    return {
        "num_beams": beam.width,
        "num_return_sequences": 1,
        "do_sample": False,
        "length_penalty": beam.length_penalty,
        "max_new_tokens": max_new,
        "min_new_tokens": floor,
        "repetition_penalty": params.repetition_penalty,
        "eos_token_id": end_ids,
        "pad_token_id": end_ids[0],
    }


class _ClientLeft:
    """A stopping criterion: every beam stops once the request's client has left."""

    def __init__(self, sequence: Sequence) -> None:
        self.sequence = sequence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.sequence.cancelled, dtype=torch.bool, device=input_ids.device)


def run_beam_search(model: Any, sequence: Sequence, beam: BeamSearch) -> None:
    """On the engine thread: the search, then its best hypothesis through `sequence`."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class ClientLeft(_ClientLeft, StoppingCriteria):
        pass

    device = next(model.parameters()).device
    prompt = torch.tensor([sequence.prompt], dtype=torch.long, device=device)
    options = beam_options(sequence.sampling, beam, sequence.max_new, sorted(int(t) for t in sequence.eos_ids))
    try:
        output = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            stopping_criteria=StoppingCriteriaList([ClientLeft(sequence)]),
            **options,
        )
    except Exception as exc:  # this request's search alone: the batch goes on
        sequence.fail(sequence_failed(sequence.request_id, exc, what="a transformers beam search"))
        return
    if sequence.cancelled:
        sequence.done = True
        return
    for token in output[0, len(sequence.prompt) :].tolist():
        if sequence.accept(int(token)):
            return
    sequence.finish("length", hit_stop=False)
