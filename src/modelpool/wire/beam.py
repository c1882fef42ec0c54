"""Beam search asked by a request (llm-pool's `decoding.beam_size`; `beam_size` on the
completions routes), checked against the request's other fields where their names are
known: beam search ranks whole hypotheses by the model's own probabilities and never
samples, so a field that asks for random sampling beside it is refused by its name rather
than quietly ignored. What depends on the model (whether its engine has beam search,
logprobs, tools, structured output) the pool checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelpool.errors import InvalidRequest
from modelpool.inference import MAX_BEAM_SIZE, BeamSearch

MIN_LENGTH_PENALTY, MAX_LENGTH_PENALTY = -5.0, 5.0
"""Bounds of `length_penalty`: the exponent of the length that divides a hypothesis's score."""

NEUTRAL = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Sampling fields at values that change nothing; any other value (and any temperature
above 0) asks for sampling, unless the request is greedy."""

DETERMINISTIC: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
"""What a beam request's sampling fields become: engines and model defaults never sample it."""


def beam_search(
    beam_size: int | None, length_penalty: float | None, given: Mapping[str, Any], *, greedy: bool, prefix: str = ""
) -> BeamSearch | None:
    """The request's beam search (None for `beam_size` 1 or left out). `given` holds the
    sampling fields by the names the request gave them (`decoding.top_p`; None: left out).
    A `greedy` request (`top_k` 1 or `temperature` 0: llm-pool's own example body sends
    `top_k: 1, temperature: 0.1`) may carry any of them; otherwise each that asks for
    sampling is a 400 naming it. `prefix` is where `beam_size` sits (`decoding.`)."""
    if beam_size is None or beam_size == 1:
        if length_penalty is not None:
            raise InvalidRequest("length_penalty applies to beam search only (beam_size above 1)",
                                 param=f"{prefix}length_penalty")  # fmt: skip
        return None
    if not 1 < beam_size <= MAX_BEAM_SIZE:  # the wire models bound it too
        raise InvalidRequest(f"beam_size must be 1 to {MAX_BEAM_SIZE}", param=f"{prefix}beam_size")
    for param, value in given.items():
        name = param.rsplit(".", 1)[-1]
        if not greedy and value is not None and (name == "temperature" or value != NEUTRAL.get(name, value)):
            raise InvalidRequest(
                f"beam search does not sample: leave out {param} (or make the request greedy with "
                "top_k 1 or temperature 0) when beam_size is above 1",
                param=param,
            )
    return BeamSearch(beam_size, 1.0 if length_penalty is None else length_penalty, f"{prefix}beam_size")
