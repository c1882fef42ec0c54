"""A model's sampling defaults, applied by the pool as it receives a request: whoever builds
the request (a route, an MCP tool, a library caller) marks what its client left out
(`SamplingParams.unset`) and never needs to look the model's defaults up first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from modelpool.config.schema import SamplingDefaults
from modelpool.errors import InvalidRequest
from modelpool.inference import SamplingParams


def with_model_defaults(sampling: SamplingParams, defaults: SamplingDefaults) -> SamplingParams:
    """`sampling` with each field its client left out taken from the model's `defaults` (a
    default the config leaves unset keeps OpenAI's). A `min_tokens` floor above the cap in
    effect, the model's default cap included, is refused naming `min_tokens`."""
    if not sampling.unset:
        return sampling
    chosen: dict[str, Any] = {name: getattr(defaults, name) for name in sampling.unset}
    resolved = replace(sampling, unset=frozenset(), **{k: v for k, v in chosen.items() if v is not None})
    if resolved.max_tokens is not None and resolved.min_tokens > resolved.max_tokens:
        raise InvalidRequest(
            f"min_tokens ({resolved.min_tokens}) must not exceed max_tokens ({resolved.max_tokens})",
            param="min_tokens",
        )
    return resolved
