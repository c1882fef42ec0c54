"""A model's sampling defaults, applied by the pool as it receives a request: whoever builds
the request (a route, an MCP tool, a library caller) marks what its client left out
(`SamplingParams.unset`) and never needs to look the model's defaults up first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from modelpool.config.schema import SamplingDefaults
from modelpool.errors import InvalidRequest
from modelpool.inference import ChatRequest, SamplingParams
from modelpool.runtime.slot import ModelSlot


def with_thinking_default(request: ChatRequest, default: bool | None) -> ChatRequest:
    """`request` with the model's configured `enable_thinking` where its client did not set one."""
    if default is None or "enable_thinking" in request.template_kwargs:
        return request
    return replace(request, template_kwargs={**request.template_kwargs, "enable_thinking": default})


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


def beam_bounded(sampling: SamplingParams, slot: ModelSlot) -> SamplingParams:
    """A beam request (its own `max_tokens` checked by `check_beam`) whose cap came from
    nowhere or from the model's default runs to the model's `max_beam_tokens` at most: a
    search cannot be stopped once started."""
    if sampling.beam is None:
        return sampling
    longest = slot.capabilities.declared.max_beam_tokens
    if sampling.max_tokens is not None and sampling.max_tokens <= longest:
        return sampling
    return replace(sampling, max_tokens=longest)


def check_beam(slot: ModelSlot, sampling: SamplingParams, *, tools: bool = False, output: bool = False) -> None:
    """Beam search goes only to a model whose engine has it, as wide as it allows
    (`Capabilities.max_beam_size`),
    and not with what it cannot give: logprobs (its tokens come from a search over whole
    hypotheses, not from one distribution each), tool calls or structured output (both
    steer tokens one at a time). Each refused naming the field."""
    beam = sampling.beam
    if beam is None:
        return
    widest = slot.capabilities.declared.max_beam_size
    if widest < 2:
        raise InvalidRequest(
            f"model '{slot.id}' ({slot.config.backend}) has no beam search; use beam_size 1, or a ctranslate2 or "
            "transformers model",
            param=beam.param,
        )
    if beam.width > widest:
        raise InvalidRequest(
            f"model '{slot.id}' allows at most {widest} beams (its max_beam_size option)", param=beam.param
        )
    longest = slot.capabilities.declared.max_beam_tokens
    asked = sampling.max_tokens if "max_tokens" not in sampling.unset else None  # a default is cut, not refused
    if asked is not None and asked > longest:
        raise InvalidRequest(
            f"model '{slot.id}' runs a beam search to at most {longest} tokens (its max_beam_tokens option): "
            f"ask for fewer, or leave beam_size at 1",
            param=beam.param.removesuffix("beam_size") + "max_tokens",
        )
    clashes = {"logprobs": sampling.logprobs is not None, "tools": tools, "response_format": output}
    for field, asked in clashes.items():
        if asked:
            raise InvalidRequest(f"{field} cannot be combined with beam search (beam_size above 1)", param=field)
