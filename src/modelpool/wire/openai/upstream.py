"""Our internal requests in the OpenAI wire format, and the upstream's answers back as
our chunks. Only what a request sets is sent: an upstream that is OpenAI itself rejects
fields it does not know (top_k, min_p, ...), so engine extras go only when asked for."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.errors import UpstreamError
from modelpool.inference import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    ContentPart,
    GenerationChunk,
    OutputFormat,
    SamplingParams,
    TextPart,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    VideoInput,
)


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    optional = {
        "max_tokens": sampling.max_tokens,
        "seed": sampling.seed,
        "stop": list(sampling.stop) or None,
        "presence_penalty": sampling.presence_penalty or None,
        "frequency_penalty": sampling.frequency_penalty or None,
        # Engine extras (vLLM, llama.cpp): only when they differ from "off".
        "top_k": sampling.top_k or None,
        "min_p": sampling.min_p or None,
        "repetition_penalty": None if sampling.repetition_penalty == 1.0 else sampling.repetition_penalty,
        "ignore_eos": sampling.ignore_eos or None,
        "min_tokens": sampling.min_tokens or None,
    }
    fields.update({key: value for key, value in optional.items() if value is not None})
    return fields


def _stream_fields(streamed: bool) -> dict[str, Any]:
    return {"stream": True, "stream_options": {"include_usage": True}} if streamed else {"stream": False}


def _wire_content(part: ContentPart) -> dict[str, Any]:
    """A part as OpenAI's API takes it: an image by the data URI modelpool loaded it into,
    or by its URL when the upstream fetches it."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, VideoInput):  # vLLM's and llm-pool's part, the video as it came
        return {"type": "video_url", "video_url": {"url": part.data_uri or part.url}}
    image_url: dict[str, Any] = {"url": part.data_uri or part.url}
    if part.detail is not None:
        image_url["detail"] = part.detail
    return {"type": "image_url", "image_url": image_url}


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    content: Any = [_wire_content(part) for part in message.parts] if message.parts else message.content
    item: dict[str, Any] = {"role": message.role, "content": content}
    if message.name:
        item["name"] = message.name
    if message.tool_calls:
        item["content"] = message.content or None
        item["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        item["tool_call_id"] = message.tool_call_id
    return item


def _tool_fields(request: ChatRequest) -> dict[str, Any]:
    """tools, tool_choice, parallel_tool_calls and response_format, as the client sent them."""
    fields: dict[str, Any] = {}
    if request.tools:
        fields["tools"] = [
            {"type": "function", "function": {"name": t.name, **({"description": t.description} if t.description
                                              else {}), "parameters": dict(t.parameters)}}
            for t in request.tools
        ]  # fmt: skip
        choice = request.tool_choice
        named = {"type": "function", "function": {"name": choice.name}}
        fields["tool_choice"] = named if choice.mode == "function" else choice.mode
        if not request.parallel_tool_calls:
            fields["parallel_tool_calls"] = False
    if request.output is not None:
        fields["response_format"] = response_format_json(request.output)
    return fields


def response_format_json(output: OutputFormat) -> dict[str, Any]:
    if output.kind == "json_object" or output.schema is None:
        return {"type": "json_object"}
    spec = {"name": output.name, "schema": dict(output.schema), "strict": True}
    return {"type": "json_schema", "json_schema": spec}


def chat_body(request: ChatRequest, model: str) -> dict[str, Any]:
    messages = [_wire_message(m) for m in request.messages]
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        **_stream_fields(request.streamed),
        **_sampling_fields(request.sampling),
        **_tool_fields(request),
    }
    if request.sampling.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = request.sampling.logprobs
    if request.template_kwargs:
        body["chat_template_kwargs"] = dict(request.template_kwargs)  # vLLM's and llama-server's name
    return body


def completion_body(request: CompletionRequest, model: str) -> dict[str, Any]:
    prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        **_stream_fields(request.streamed),
        **_sampling_fields(request.sampling),
    }
    if request.echo:
        body["echo"] = True
    if request.output is not None:
        body["response_format"] = response_format_json(request.output)
    if request.sampling.logprobs is not None:
        body["logprobs"] = request.sampling.logprobs
    return body


def embeddings_body(inputs: tuple[str | tuple[int, ...], ...], model: str) -> dict[str, Any]:
    return {
        "model": model,
        "input": [item if isinstance(item, str) else list(item) for item in inputs],
        "encoding_format": "base64",
    }


def embedding_vectors(payload: dict[str, Any], expected: int) -> npt.NDArray[np.float32]:
    """Rows in input order, whether the upstream honoured base64 or sent float lists."""
    data = sorted(payload.get("data") or [], key=lambda item: item.get("index", 0))
    if len(data) != expected:
        raise UpstreamError(502, f"upstream returned {len(data)} embeddings for {expected} inputs")
    rows = []
    for item in data:
        vector = item.get("embedding")
        if isinstance(vector, str):
            rows.append(np.frombuffer(base64.b64decode(vector), dtype="<f4"))
        else:
            rows.append(np.asarray(vector, dtype=np.float32))
    return np.stack(rows).astype(np.float32, copy=False)


def usage_of(payload: dict[str, Any]) -> Usage | None:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def _chat_piece(choice: dict[str, Any]) -> GenerationChunk:
    delta = choice.get("delta") or {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    logprobs = _chat_logprobs(choice.get("logprobs"))
    calls = _call_pieces(delta.get("tool_calls"))
    return GenerationChunk(delta.get("content") or "", logprobs, reasoning=reasoning, tool_calls=calls)


def _call_pieces(calls: Any) -> tuple[ToolCallDelta, ...]:
    """An upstream's tool calls (streamed pieces or whole calls) as our pieces."""
    if not isinstance(calls, list):
        return ()
    pieces = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        pieces.append(
            ToolCallDelta(
                index=int(call.get("index", position)),
                id=call.get("id"),
                name=function.get("name"),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
            )
        )
    return tuple(pieces)


def _completion_piece(choice: dict[str, Any]) -> GenerationChunk:
    return GenerationChunk(choice.get("text") or "", _completion_logprobs(choice.get("logprobs")))


async def _stream_chunks(
    events: AsyncIterator[dict[str, Any]], piece: Callable[[dict[str, Any]], GenerationChunk]
) -> AsyncGenerator[GenerationChunk, None]:
    """Upstream stream events → our chunks. The finish reason is held back until the usage
    event that follows it, so our last chunk carries both, as backends' last chunks do."""
    finish: str | None = None
    stop: str | None = None
    usage: Usage | None = None
    pieces = 0
    async for event in events:
        usage = usage_of(event) or usage
        for choice in event.get("choices") or []:
            chunk = piece(choice)
            if chunk.text or chunk.reasoning or chunk.logprobs or chunk.tool_calls:
                pieces += 1
                yield replace(chunk, token_count=1)  # as `_counted` reckons: counted as it passes
            finish = choice.get("finish_reason") or finish
            stop = stop_string(choice) or stop
    yield GenerationChunk(finish_reason=finish or "stop", usage=usage or _counted(pieces), stop_sequence=stop)


def chat_chunks(events: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[GenerationChunk, None]:
    return _first_names_only(_stream_chunks(events, _chat_piece))


async def _first_names_only(chunks: AsyncGenerator[GenerationChunk, None]) -> AsyncGenerator[GenerationChunk, None]:
    """A call's id and name are sent once, on its first piece, as OpenAI streams them.
    llama-cpp-python's server repeats the name on every piece, and clients that join
    pieces (the openai SDK does) would read `get_weatherget_weather...`."""
    named: set[int] = set()
    async with aclosing(chunks):
        async for chunk in chunks:
            if chunk.tool_calls:
                pieces = []
                for piece in chunk.tool_calls:
                    if piece.index in named:
                        piece = replace(piece, id=None, name=None)
                    named.add(piece.index)
                    pieces.append(piece)
                chunk = replace(chunk, tool_calls=tuple(pieces))
            yield chunk


def completion_chunks(events: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[GenerationChunk, None]:
    return _stream_chunks(events, _completion_piece)


def chat_whole(payload: dict[str, Any]) -> list[GenerationChunk]:
    """A whole chat completion → our chunks: the answer, then the finish with usage."""
    choice = _first_choice(payload)
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    logprobs = _chat_logprobs(choice.get("logprobs"))
    calls = _call_pieces(message.get("tool_calls"))
    answer = GenerationChunk(text=text, reasoning=reasoning, logprobs=logprobs, tool_calls=calls)
    return [answer, _finish(choice, payload)]


def completion_whole(payload: dict[str, Any]) -> list[GenerationChunk]:
    choice = _first_choice(payload)
    answer = GenerationChunk(text=choice.get("text") or "", logprobs=_completion_logprobs(choice.get("logprobs")))
    return [answer, _finish(choice, payload)]


def _finish(choice: dict[str, Any], payload: dict[str, Any]) -> GenerationChunk:
    reason = choice.get("finish_reason") or "stop"
    return GenerationChunk(finish_reason=reason, usage=usage_of(payload), stop_sequence=stop_string(choice))


def stop_string(choice: dict[str, Any]) -> str | None:
    """The stop string that ended a choice, where the upstream says (vLLM's `stop_reason`;
    an int there is a stop token, which is not a stop sequence)."""
    value = choice.get("stop_reason")
    return value if isinstance(value, str) else None


def _first_choice(payload: dict[str, Any]) -> dict[str, Any]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError(502, "upstream answered without any choice")
    return choices[0]


def _counted(pieces: int) -> Usage:
    """For upstreams that send no usage on streams (llama-cpp-python's server): llama.cpp
    and vLLM stream one token per event, so the events are the completion tokens; the
    prompt's tokens are unknown and reported as 0."""
    return Usage(prompt_tokens=0, completion_tokens=pieces)


def _token_bytes(token: str, raw: Any) -> tuple[int, ...]:
    return tuple(raw) if isinstance(raw, list) else tuple(token.encode("utf-8", errors="replace"))


def _chat_logprobs(logprobs: Any) -> tuple[TokenLogprob, ...]:
    if not isinstance(logprobs, dict):
        return ()
    tokens = []
    for entry in logprobs.get("content") or []:
        token = str(entry.get("token", ""))
        top = tuple(_top_logprob(t) for t in entry.get("top_logprobs") or [])
        logprob = entry.get("logprob")
        value = None if logprob is None else float(logprob)
        tokens.append(TokenLogprob(token, value, _token_bytes(token, entry.get("bytes")), top))
    return tuple(tokens)


def _top_logprob(entry: dict[str, Any]) -> TopLogprob:
    token = str(entry.get("token", ""))
    return TopLogprob(token, float(entry.get("logprob", 0.0)), _token_bytes(token, entry.get("bytes")))


def _completion_logprobs(logprobs: Any) -> tuple[TokenLogprob, ...]:
    """The legacy shape: parallel lists `tokens`, `token_logprobs`, `top_logprobs` (dicts)."""
    if not isinstance(logprobs, dict):
        return ()
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or [None] * len(tokens)
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    result = []
    for token, value, top in zip(tokens, values, tops, strict=False):
        alternatives = tuple(
            TopLogprob(str(t), float(lp), tuple(str(t).encode("utf-8", errors="replace")))
            for t, lp in (top or {}).items()
        )
        best = max((a.logprob for a in alternatives), default=None)
        greedy = value is None or best is None or float(value) >= best
        result.append(
            TokenLogprob(
                str(token),
                None if value is None else float(value),
                _token_bytes(str(token), None),
                alternatives,
                greedy=greedy,
            )
        )
    return tuple(result)
