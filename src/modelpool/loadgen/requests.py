"""One request of each kind, timed: the body, the send, and reading the reply (a stream as it
arrives). Every failure is recorded as a kind of error, never raised: a refusing, closing,
slow or garbled server is a result to count."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from modelpool.loadgen.records import RequestRecord
from modelpool.loadgen.spec import LoadSpec


class _Bad(Exception):
    """A reply that is not what the protocol says (its kind, and why)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


async def send(client: httpx.AsyncClient, spec: LoadSpec, prompt: str, record: RequestRecord) -> RequestRecord:
    """Send one request and fill `record`; bounded by `spec.timeout_s` as a whole."""
    began = time.perf_counter()
    try:
        await asyncio.wait_for(_exchange(client, spec, prompt, record, began), timeout=spec.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):  # not the builtin: on 3.10 wait_for raises its own
        record.fail("timeout", f"no complete reply within {spec.timeout_s:g} s")
    except httpx.ConnectError as error:
        record.fail("connect", str(error) or "connection refused")
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
        record.fail("closed", str(error) or "the server closed the connection")
    except httpx.HTTPError as error:
        record.fail("http", f"{type(error).__name__}: {error}")
    except _Bad as bad:
        record.fail(bad.kind, str(bad))
    record.latency_s = time.perf_counter() - began
    return record


async def _exchange(
    client: httpx.AsyncClient, spec: LoadSpec, prompt: str, record: RequestRecord, began: float
) -> None:
    response = await _open(client, spec, prompt, record)
    try:
        record.status = response.status_code
        if response.status_code != 200:
            body = (await response.aread())[:300].decode(errors="replace")
            raise _Bad(f"http_{response.status_code}", body)
        if spec.kind == "speech":
            await _read_audio(response, record, began)
        elif spec.stream and spec.kind in ("chat", "completion"):
            await _read_stream(response, spec, record, began)
        else:
            _read_json(await response.aread(), spec, record, began)
    finally:
        await response.aclose()


_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


async def _open(client: httpx.AsyncClient, spec: LoadSpec, prompt: str, record: RequestRecord) -> httpx.Response:
    """Send the request; its reply's head. A kept-alive connection the server has closed
    fails before any byte of the reply: llama-server (cpp-httplib) closes the connection
    after every streamed reply while its headers say `Keep-Alive`, and when the next request
    goes out before its FIN arrives it meets a closed socket. That request, and only one
    that failed on a reused connection (no connect traced) before its status line, is sent
    once more, on a fresh connection (the pool has dropped the dead one), and counted in
    `record.resent`. A failure on a fresh connection is the server's and is reported."""
    connected = False

    async def trace(event: str, info: dict[str, Any]) -> None:
        nonlocal connected
        connected = connected or event.startswith("connection.connect_")  # tcp or unix socket

    request = _build(client, spec, prompt)
    request.extensions["trace"] = trace
    try:
        return await client.send(request, stream=True)
    except _STALE:
        if connected:
            raise
    record.resent += 1
    return await client.send(_build(client, spec, prompt), stream=True)


def _headers(spec: LoadSpec) -> dict[str, str]:
    return {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}


def _build(client: httpx.AsyncClient, spec: LoadSpec, prompt: str) -> httpx.Request:
    url, headers = spec.url(), _headers(spec)
    if spec.kind == "transcription":
        files = {"file": (spec.audio_name, spec.audio, "audio/wav")}
        data = {"model": spec.model, **{k: str(v) for k, v in spec.extra_body.items()}}
        return client.build_request("POST", url, headers=headers, files=files, data=data)
    return client.build_request("POST", url, headers=headers, json=body(spec, prompt))


def body(spec: LoadSpec, prompt: str) -> dict[str, Any]:
    """The JSON body of one request of the spec's kind."""
    if spec.kind == "embeddings":
        return {"model": spec.model, "input": prompt, **spec.extra_body}
    if spec.kind == "speech":
        return {"model": spec.model, "input": prompt, "voice": spec.voice, "response_format": "wav", **spec.extra_body}
    out: dict[str, Any] = {"model": spec.model, "max_tokens": spec.max_tokens}
    if spec.kind == "chat":
        out["messages"] = [{"role": "user", "content": prompt}]
    else:
        out["prompt"] = prompt
    if spec.temperature is not None:
        out["temperature"] = spec.temperature
    if spec.ignore_eos:
        out["ignore_eos"] = True
    if spec.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # exact token counts where the server sends them
    return {**out, **spec.extra_body}


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any] | None]:
    """The stream's JSON events; `None` for its `[DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            yield None
            continue
        try:
            event = json.loads(data)
        except ValueError:
            raise _Bad("non_json", f"a stream event that is not JSON: {data[:120]}") from None
        if not isinstance(event, dict):
            raise _Bad("non_json", f"a stream event that is not an object: {data[:120]}")
        if "error" in event:
            raise _Bad("stream_error", json.dumps(event["error"])[:300])
        yield event


def _content(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if choice.get("text") or (isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content"))):
            return True
    return False


async def _read_stream(response: httpx.Response, spec: LoadSpec, record: RequestRecord, began: float) -> None:
    chunks, last, done = 0, 0.0, False
    async for event in _events(response):
        if event is None:
            done = True
            continue
        if _content(event):
            now = time.perf_counter() - began
            if chunks == 0:
                record.ttft_s = now
            else:
                record.chunk_gaps_s.append(now - last)
            chunks, last = chunks + 1, now
        _take_usage(event.get("usage"), record)
    if not done:
        raise _Bad("incomplete", f"the stream ended without [DONE] after {chunks} content chunk(s)")
    if not record.tokens_from_usage:
        record.output_tokens = chunks


def _take_usage(usage: object, record: RequestRecord) -> None:
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
        record.tokens_from_usage = True
    for key in ("prompt_tokens", "input_tokens"):
        if isinstance(usage.get(key), int):
            record.prompt_tokens = usage[key]
    if not record.tokens_from_usage and isinstance(usage.get("output_tokens"), int):
        record.output_tokens = usage["output_tokens"]
        record.tokens_from_usage = True


def _read_json(raw: bytes, spec: LoadSpec, record: RequestRecord, began: float) -> None:
    try:
        reply = json.loads(raw)
    except ValueError:
        raise _Bad("non_json", f"a reply that is not JSON: {raw[:120].decode(errors='replace')}") from None
    if not isinstance(reply, dict):
        raise _Bad("non_json", "a reply that is not a JSON object")
    if spec.kind == "embeddings" and not isinstance(reply.get("data"), list):
        raise _Bad("bad_reply", "an embeddings reply without a data list")
    if spec.kind == "transcription" and not isinstance(reply.get("text"), str):
        raise _Bad("bad_reply", "a transcription reply without text")
    if spec.kind in ("chat", "completion") and not isinstance(reply.get("choices"), list):
        raise _Bad("bad_reply", "a completion reply without choices")
    _take_usage(reply.get("usage"), record)
    if spec.kind in ("chat", "completion"):
        record.ttft_s = time.perf_counter() - began  # unstreamed: the whole reply is the first token


async def _read_audio(response: httpx.Response, record: RequestRecord, began: float) -> None:
    async for piece in response.aiter_bytes():
        if piece and record.ttft_s is None:
            record.ttft_s = time.perf_counter() - began  # time to first audio byte
        record.output_bytes += len(piece)
    if record.output_bytes == 0:
        raise _Bad("incomplete", "a speech reply without audio")
    if response.headers.get("content-type", "").startswith("application/json"):
        raise _Bad("bad_reply", "a speech reply that is JSON, not audio")
