"""Reading servers' answers (fast, no server): reasoning aliasing on recorded responses of
several engines, the error mapping (envelope code first, then status), server-sent events
with a mid-stream error, images and audio uploads, and how request bodies are layered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool.client import (
    ChatMessage,
    ClientError,
    ContextLengthExceeded,
    InvalidRequest,
    LLMClient,
    ModelLoadError,
    ModelNotReady,
    Overloaded,
    PermissionDenied,
    RemoteNotAllowed,
    ServerError,
    UpstreamUnavailable,
    parse_models_config,
)
from modelpool.client.audio import audio_upload
from modelpool.client.errors import error_from_response
from modelpool.client.presets import PRESETS
from modelpool.client.results import chat_delta, chat_result
from modelpool.client.transport import sse_events

THOUGHT = "The user wants a number. 2+2 is 4."


def _message(**fields: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "4", **fields},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}}  # fmt: skip


RECORDED = {
    # (preset, what the engine sent): each engine's own field name for the same thinking
    "qwen3 on vLLM": ("qwen3", _message(reasoning_content=THOUGHT)),
    "qwen3 on modelpool": ("qwen3", _message(reasoning_content=THOUGHT)),
    "deepseek-r1 on llama-server": ("deepseek-r1", _message(reasoning_content=THOUGHT)),
    "deepseek-r1 on Ollama": ("deepseek-r1", _message(reasoning=THOUGHT)),
    "gpt-oss on Ollama": ("gpt-oss", _message(reasoning=THOUGHT)),
    "gpt-oss on vLLM": ("gpt-oss", _message(reasoning_content=THOUGHT, reasoning=None)),
    "gpt-oss on OpenRouter": ("gpt-oss", _message(reasoning=THOUGHT, reasoning_details=[{"type": "x"}])),
}


@pytest.mark.parametrize("engine", list(RECORDED))
def test_reasoning_reads_the_same_whichever_field_the_engine_used(engine: str) -> None:
    preset, raw = RECORDED[engine]
    result = chat_result(raw, PRESETS[preset].reasoning_fields)
    assert (result.reasoning, result.content, result.finish_reason) == (THOUGHT, "4", "stop")
    assert result.usage is not None and result.usage.total_tokens == 21 and result.raw is raw


def test_reasoning_in_stream_deltas_and_a_usage_only_chunk() -> None:
    fields = PRESETS["gpt-oss"].reasoning_fields
    delta = chat_delta({"choices": [{"index": 0, "delta": {"reasoning": "hm"}, "finish_reason": None}]}, fields)
    assert (delta.reasoning, delta.content) == ("hm", "")
    last = chat_delta({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, fields)
    assert last.usage is not None and last.usage.total_tokens == 5 and last.finish_reason is None
    plain = chat_result(_message(), PRESETS["smollm2"].reasoning_fields)
    assert plain.reasoning == ""


def _response(status: int, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.Response(status, content=content, headers=headers)


def _envelope(code: str | None, message: str = "m", **fields: object) -> dict[str, object]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code, **fields}}


@pytest.mark.parametrize(
    ("status", "body", "cls", "code"),
    [
        (503, _envelope("model_not_ready"), ModelNotReady, "model_not_ready"),
        (503, _envelope("model_load_error"), ModelLoadError, "model_load_error"),
        (503, _envelope("model_source_error"), ModelLoadError, "model_source_error"),
        (503, _envelope("shutting_down"), ServerError, "shutting_down"),
        (502, _envelope("upstream_error"), UpstreamUnavailable, "upstream_error"),
        (403, _envelope("remote_not_allowed"), RemoteNotAllowed, "remote_not_allowed"),
        (403, _envelope("insufficient_scope"), PermissionDenied, "insufficient_scope"),
        (400, _envelope("context_length_exceeded"), ContextLengthExceeded, "context_length_exceeded"),
        (400, {"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}}, InvalidRequest, None),
        (500, {"error": "something broke"}, ServerError, None),
        (418, _envelope(None), ClientError, None),
    ],
)
def test_errors_map_by_code_first_then_status(status: int, body: object, cls: type, code: str | None) -> None:
    error = error_from_response(_response(status, body))
    assert type(error) is cls and (error.status_code, error.code) == (status, code)


def test_bodies_that_are_not_envelopes_map_by_status_with_their_text() -> None:
    detail = {"detail": [{"loc": ["body", "temperature"], "msg": "Input should be a valid number"}]}
    fastapi = error_from_response(_response(422, detail))
    assert isinstance(fastapi, InvalidRequest) and "Input should be a valid number" in fastapi.message
    proxy = error_from_response(_response(502, b"<html>Bad Gateway</html>"))
    assert isinstance(proxy, UpstreamUnavailable) and proxy.message == "HTTP 502: <html>Bad Gateway</html>"
    busy = error_from_response(_response(429, _envelope("overloaded"), {"Retry-After": "3"}))
    assert isinstance(busy, Overloaded) and busy.retry_after_s == 3.0


def _stream(text: str) -> httpx.Response:
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


async def test_sse_events_up_to_done() -> None:
    text = (": a comment\r\nevent: message\r\ndata: {\"a\": 1}\r\n\r\n"
            "data: {\"b\":\ndata: 2}\n\n"
            "data: [DONE]\n\ndata: {\"after\": 3}\n\n")  # fmt: skip
    assert [event async for event in sse_events(_stream(text))] == [{"a": 1}, {"b": 2}]


async def test_an_error_event_mid_stream_raises_it_typed() -> None:
    error = _envelope("upstream_unavailable", "engine process (pid 7) was killed by signal 9")
    text = f"data: {json.dumps({'choices': [{'delta': {'content': 'Hi'}}]})}\n\ndata: {json.dumps(error)}\n\n"
    seen = []
    with pytest.raises(UpstreamUnavailable, match="killed by signal 9") as caught:
        async for event in sse_events(_stream(text + "data: [DONE]\n\n")):
            seen.append(event)
    assert len(seen) == 1 and caught.value.code == "upstream_unavailable"
    bug = {"error": {"message": "(request id 1a2b)", "type": "server_error", "param": None, "code": "internal_error"}}
    with pytest.raises(ServerError, match="request id 1a2b"):
        [event async for event in sse_events(_stream(f"data: {json.dumps(bug)}\n\n"))]


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 16


def test_images_become_image_url_parts(tmp_path: Path) -> None:
    (tmp_path / "photo.bin").write_bytes(JPEG)
    message = ChatMessage.user("What is this?", images=[PNG, tmp_path / "photo.bin", "https://x.test/a.gif",
                                                        "data:image/gif;base64,R0lGOD"])  # fmt: skip
    assert isinstance(message.content, list)
    text, *images = message.content
    assert text == {"type": "text", "text": "What is this?"}
    urls = [part["image_url"]["url"] for part in images]
    assert urls[0].startswith("data:image/png;base64,iVBORw0KGgo") and urls[1].startswith("data:image/jpeg;base64,")
    assert urls[2:] == ["https://x.test/a.gif", "data:image/gif;base64,R0lGOD"]
    assert ChatMessage.user("plain").to_wire() == {"role": "user", "content": "plain"}


def test_audio_uploads_get_a_name_and_type(tmp_path: Path) -> None:
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    assert audio_upload(wav)[1:] == ("audio.wav", "audio/wav")
    (tmp_path / "memo.mp3").write_bytes(b"ID3\x04" + b"\x00" * 8)
    assert audio_upload(tmp_path / "memo.mp3")[1:] == ("memo.mp3", "audio/mpeg")
    assert audio_upload(b"????", "x.raw")[1:] == ("x.raw", "application/octet-stream")


async def test_request_bodies_layer_endpoint_extras_call_fields_and_call_extras() -> None:
    config = parse_models_config({"q": {
        "kind": "preset:qwen3", "base_url": "http://127.0.0.1:9", "model_name": "qwen3-8b",
        "extra_body": {"keep_alive": "5m", "chat_template_kwargs": {"custom": 1}, "top_k": 20},
    }}, environ={})  # fmt: skip
    async with LLMClient(config.endpoint("q"), "http://127.0.0.1:9") as llm:
        fields = llm._chat_fields([ChatMessage.user("hi")], {"max_tokens": 8, "stop": ["\n"], "enable_thinking": False})
        body = llm._body(fields, {"top_k": 40})
    assert body == {
        "keep_alive": "5m",
        "chat_template_kwargs": {"custom": 1, "enable_thinking": False},
        "top_k": 40,
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stop": ["\n"],
    }
