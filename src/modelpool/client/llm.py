"""Chat and completion clients (LLM and VLM roles).

The preset decides the engine-specific parts of the request — the model name, whether
and how `enable_thinking` is sent, whether usage is asked for in streams — and where the
reasoning text is read from in the answer, so the same call works on every server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from modelpool.client.base import RoleClient
from modelpool.client.config import Endpoint
from modelpool.client.errors import ConfigError
from modelpool.client.messages import MessageLike, messages_to_wire
from modelpool.client.presets import Role, Thinking
from modelpool.client.results import ChatDelta, ChatResult, Completion, chat_delta, chat_result, completion
from modelpool.client.transport import sse_events

Stop = str | Sequence[str] | None


class LLMClient(RoleClient):
    kind: ClassVar[Role] = Role.LLM

    async def chat(
        self,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Stop = None,
        enable_thinking: bool | None = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> ChatResult:
        fields = self._chat_fields(messages, max_tokens, temperature, top_p, stop, enable_thinking, seed)
        raw = await self._transport.post_json("/v1/chat/completions", self._body(fields, extra_body))
        return chat_result(raw, self.endpoint.reasoning_fields)

    async def stream_chat(
        self,
        messages: Sequence[MessageLike],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Stop = None,
        enable_thinking: bool | None = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        """Deltas as the server sends them; with `stream_usage`, the last one carries usage.
        An endpoint without streaming gets one request, delivered as a single delta."""
        fields = self._chat_fields(messages, max_tokens, temperature, top_p, stop, enable_thinking, seed)
        caps = self.endpoint.capabilities
        if not caps.streaming:
            whole = await self.chat(messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop,
                                    enable_thinking=enable_thinking, seed=seed, extra_body=extra_body)  # fmt: skip
            yield ChatDelta(whole.content, whole.reasoning, whole.finish_reason, whole.usage)
            return
        fields["stream"] = True
        if caps.stream_usage:
            fields["stream_options"] = {"include_usage": True}
        async with self._transport.stream("/v1/chat/completions", self._body(fields, extra_body)) as response:
            async for event in sse_events(response):
                if event.get("choices") or event.get("usage"):
                    yield chat_delta(event, self.endpoint.reasoning_fields)

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Stop = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        """A plain-text completion (/v1/completions): no chat template."""
        fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                  "stop": _stop(stop), "seed": seed}  # fmt: skip
        return completion(await self._transport.post_json("/v1/completions", self._body(fields, extra_body)))

    def _chat_fields(
        self,
        messages: Sequence[MessageLike],
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        stop: Stop,
        enable_thinking: bool | None,
        seed: int | None,
    ) -> dict[str, Any]:
        return {
            "messages": messages_to_wire(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stop": _stop(stop),
            "seed": seed,
            **thinking_fields(self.endpoint.thinking, enable_thinking),
        }


class VLMClient(LLMClient):
    """An LLM that also reads images: build messages with `ChatMessage.user(text, images=[...])`.
    Refuses endpoints whose capabilities do not include `vision` (set by the preset, or
    `capabilities: {vision: true}` in models.yaml)."""

    def __init__(self, endpoint: Endpoint, base_url: str) -> None:
        if not endpoint.capabilities.vision:
            raise ConfigError(
                f"role {endpoint.role!r} cannot be a VLM: its capabilities do not include vision "
                f"(preset {endpoint.preset.name}); set `capabilities: {{vision: true}}` if the model reads images"
            )
        super().__init__(endpoint, base_url)


def thinking_fields(thinking: Thinking, enable: bool | None) -> dict[str, Any]:
    """How `enable_thinking` goes on the wire. Nothing unless asked, and nothing for models
    without a switch (DeepSeek-R1 and gpt-oss always think: False cannot be honoured)."""
    if enable is None or thinking is not Thinking.CHAT_TEMPLATE_KWARGS:
        return {}
    return {"chat_template_kwargs": {"enable_thinking": enable}}


def _stop(stop: Stop) -> str | list[str] | None:
    return stop if stop is None or isinstance(stop, str) else list(stop)
