"""Bad input on /mcp gets JSON-RPC errors: through the official MCP client (tool calls), and
as raw HTTP (what the transport itself refuses)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent

from modelpool.server.app import create_app
from tests.audio_files import wav_bytes
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL
from tests.e2e.mcp_helpers import mcp_client, mcp_config
from tests.e2e.test_vision import VLM, data_uri, png, vlm_config
from tests.live_server import live_server
from tests.vlm_models import tiny_llava

INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR = -32602, -32600, -32601, -32700
MAX_UPLOAD = 40_000
BROKEN = "broken-embedder"  # its weights are not there: it fails to load
MEDIA = Path("media")  # replaced by the fixture's folder in `path` arguments
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass(frozen=True)
class Served:
    url: str
    media: Path


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """Nothing preloaded: every row is refused before a model would have to load."""
    media, outside = tmp_path_factory.mktemp("media"), tmp_path_factory.mktemp("outside")
    (outside / "speech.wav").write_bytes(wav_bytes())
    (media / "escape.wav").symlink_to(outside / "speech.wav")
    (media / "notes.txt").write_bytes(b"not audio at all")
    broken = {BROKEN: {"backend": "sentence_transformers", "source": str(outside / "no-such-model"),
                       "preload": False},
              VLM: {**vlm_config(tiny_llava()), "preload": False}}  # fmt: skip
    config = mcp_config(tmp_path_factory.mktemp("store"), media, preload=False, more=broken, max_body_bytes=200_000,
                        max_upload_bytes=MAX_UPLOAD)  # fmt: skip
    async with live_server(create_app(config)) as url:
        yield Served(url, media)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


TURN = [{"role": "user", "content": "hi"}]
RED = data_uri(png("red", (8, 8)))
# (tool, arguments, the `param` the error names, its `code` in data, a piece of its message)
TOOL_CALLS: dict[str, tuple[str, dict[str, Any], str | None, str | None, str]] = {
    "unknown tool": ("launch_rockets", {}, "name", None, "Unknown tool"),
    "misspelt argument": ("chat", {"model": CHAT_MODEL, "messages": TURN, "max_token": 5}, "max_token",
                          "invalid_value", "Unrecognized argument: 'max_token'"),
    "missing argument": ("embed", {"model": EMBED_MODEL}, "input", "invalid_value", "Missing required parameter"),
    "wrong type": ("add_transcript", {"source_id": "s", "text": "t", "start": "soon", "end": 1}, "start",
                   "invalid_value", "number"),
    "unknown role": ("chat", {"model": CHAT_MODEL, "messages": [{"role": "robot", "content": "x"}]},
                     "messages[0].role", "invalid_value", "'system', 'user' or 'assistant'"),
    "no messages": ("chat", {"model": CHAT_MODEL, "messages": []}, "messages", "invalid_value", "at least 1"),
    "zero max_tokens": ("chat", {"model": CHAT_MODEL, "messages": TURN, "max_tokens": 0}, "max_tokens",
                        "invalid_value", "greater than or equal to 1"),
    "unknown model": ("embed", {"model": "gpt-17", "input": ["x"]}, "model", "model_not_found", "does not exist"),
    "model without the task": ("embed", {"model": CHAT_MODEL, "input": ["x"]}, "model", "unsupported_task",
                               "does not do embedding"),
    "rerank top_n 0": ("rerank", {"model": EMBED_MODEL, "query": "q", "documents": ["d"], "top_n": 0}, "top_n",
                       "invalid_value", "greater than or equal to 1"),
    "invalid base64": ("transcribe", {"model": STT_MODEL, "audio_base64": "***not base64***"}, "audio_base64",
                       "invalid_value", "not valid base64"),
    "data URI without base64": ("transcribe", {"model": STT_MODEL, "audio_base64": "data:audio/wav,RIFF"},
                                "audio_base64", "invalid_value", "must hold base64"),
    "no audio": ("transcribe", {"model": STT_MODEL}, "audio_base64", "invalid_value", "exactly one of"),
    "both audios": ("transcribe", {"model": STT_MODEL, "audio_base64": b64(wav_bytes()), "path": "x.wav"},
                    "audio_base64", "invalid_value", "exactly one of"),
    "audio over the limit": ("transcribe", {"model": STT_MODEL, "audio_base64": b64(bytes(MAX_UPLOAD + 1))},
                             "audio_base64", "request_too_large", "server.max_upload_bytes"),
    "not audio": ("transcribe", {"model": STT_MODEL, "audio_base64": b64(b"plain text, no sound")},
                  "audio_base64", "invalid_value", "audio"),
    "path outside the allowed dirs": ("transcribe", {"model": STT_MODEL, "path": "/etc/hostname"}, "path",
                                      "invalid_value", "allowed_local_media_dirs"),
    "dot-dot out of the allowed dir": ("transcribe", {"model": STT_MODEL, "path": str(MEDIA / ".." / "x.wav")},
                                       "path", "invalid_value", "allowed_local_media_dirs"),
    "link out of the allowed dir": ("transcribe", {"model": STT_MODEL, "path": str(MEDIA / "escape.wav")}, "path",
                                    "invalid_value", "allowed_local_media_dirs"),
    "missing file": ("transcribe", {"model": STT_MODEL, "path": str(MEDIA / "absent.wav")}, "path",
                     "invalid_value", "cannot be read"),
    "a directory, not a file": ("transcribe", {"model": STT_MODEL, "path": str(MEDIA)}, "path", "invalid_value",
                                "regular file"),
    "file that is not audio": ("transcribe", {"model": STT_MODEL, "path": str(MEDIA / "notes.txt")}, "path",
                               "invalid_value", "audio"),
    "blank speech": ("speak", {"model": TTS_MODEL, "text": "   "}, "text", "invalid_value", "match pattern"),
    "speed too high": ("speak", {"model": TTS_MODEL, "text": "hi", "speed": 9}, "speed", "invalid_value",
                       "less than or equal to 4"),
    "unknown audio format": ("speak", {"model": TTS_MODEL, "text": "hi", "format": "ogg"}, "format",
                             "invalid_value", "'wav'"),
    "end before start": ("add_transcript", {"source_id": "s", "text": "t", "start": 5, "end": 1}, "end",
                         "invalid_value", "end: end (1.0) is before start (5.0)"),
    "empty source id": ("add_transcript", {"source_id": "", "text": "t", "start": 0, "end": 1}, "source_id",
                        "invalid_value", "at least 1 character"),
    "limit 0": ("query_transcripts", {"limit": 0}, "limit", "invalid_value", "greater than or equal to 1"),
    # chat's image: the HTTP route's image rules and errors (media/images.py), checked before any load
    "image on a text-only model": ("chat", {"model": CHAT_MODEL, "messages": TURN, "image_url": RED},
                                   "messages[0].content[1]", "modality_unsupported", "image"),
    "image after an assistant turn": ("chat", {"model": VLM, "image_url": RED, "messages": [
                                      *TURN, {"role": "assistant", "content": "hello"}]}, "image_url",
                                      "invalid_value", "must be the user's"),
    "empty image_url": ("chat", {"model": VLM, "messages": TURN, "image_url": ""}, "image_url", "invalid_value",
                        "at least 1 character"),
    "image file outside the allowed dirs": ("chat", {"model": VLM, "messages": TURN,
                                            "image_url": "file:///etc/hostname"}, "messages[0].content[1]",
                                            "invalid_value", "allowed_local_media_dirs"),
    "remote image not allowed": ("chat", {"model": VLM, "messages": TURN, "image_url": "https://example.com/a.png"},
                                 "messages[0].content[1]", "invalid_value", "allow_remote_images"),
    "image that is not an image": ("chat", {"model": VLM, "messages": TURN, "image_url": data_uri(b"no image")},
                                   "messages[0].content[1]", "invalid_value", "cannot be decoded"),
}  # fmt: skip


@pytest.mark.parametrize("case", TOOL_CALLS, ids=list(TOOL_CALLS))
async def test_tool_calls(served: Served, case: str) -> None:
    tool, arguments, param, code, message = TOOL_CALLS[case]
    if isinstance(arguments.get("path"), str) and arguments["path"].startswith(str(MEDIA)):
        arguments = {**arguments, "path": str(served.media) + arguments["path"][len(str(MEDIA)) :]}
    async with mcp_client(served.url) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(tool, arguments)
        assert (await client.call_tool("list_sources", {})).is_error is False  # the server is still fine
    error = refused.value
    assert error.code == INVALID_PARAMS and message in error.message, error.message
    assert error.data["param"] == param
    if code is not None:
        assert error.data["code"] == code
    assert "Traceback" not in error.message and 'File "' not in error.message


async def test_work_that_fails_is_a_tool_error_the_model_can_read(served: Served) -> None:
    """Not the caller's mistake (a model that cannot load: 503 over HTTP): an isError result."""
    async with mcp_client(served.url) as client:
        result = await client.call_tool("embed", {"model": BROKEN, "input": ["x"]})
    (block,) = result.content
    assert result.is_error and isinstance(block, TextContent)
    assert BROKEN in block.text and "no-such-model" in block.text, block.text
    assert "Traceback" not in block.text


RAW: dict[str, tuple[str, Any, dict[str, str], int, int | None, str]] = {
    # (method, body (bytes: sent as is), extra headers, HTTP status, JSON-RPC code, a piece of the message)
    "not JSON": ("POST", b"{not json", {}, 400, PARSE_ERROR, "Parse error"),
    "unknown method": ("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/explode"}, {}, 200, METHOD_NOT_FOUND,
                       "Method not found"),
    "not JSON-RPC": ("POST", {"hello": "world"}, {}, 400, INVALID_PARAMS, "Validation error"),
    "no session stream to GET": ("GET", None, {}, 405, INVALID_REQUEST, "Method Not Allowed"),
    "body over the limit": ("POST", b"x" * 200_001, {}, 413, INVALID_REQUEST, "exceeds the limit"),
    "a foreign Host (DNS rebinding)": ("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                       {"Host": "evil.example"}, 421, None, "Invalid Host"),
    "a foreign Origin": ("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         {"Origin": "http://evil.example"}, 403, None, "Invalid Origin"),
}  # fmt: skip


@pytest.mark.parametrize("case", RAW, ids=list(RAW))
async def test_raw_requests(served: Served, case: str) -> None:
    method, body, headers, status, code, message = RAW[case]
    content = body if isinstance(body, bytes) else None
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
        response = await http.request(method, "/mcp", content=content, json=None if content else body,
                                      headers={**HEADERS, **headers})  # fmt: skip
    assert response.status_code == status, response.text
    if code is None:  # the SDK's own refusals of a request not meant for this server
        assert message in response.text
        return
    error = response.json()["error"]
    assert error["code"] == code and message in error["message"], error


@pytest.mark.parametrize(
    "server", [{"host": "0.0.0.0"}, {"cors_origins": ["*"]}], ids=["bound beyond loopback", "any origin"]
)
async def test_no_host_check_where_clients_use_other_names(tmp_path: Path, server: dict[str, Any]) -> None:
    """Bound to every interface, clients reach the server by its LAN name or through a proxy
    (the API keys guard it) and a page the server serves itself calls it from that name;
    with `*` origins, any page may call. Neither is refused."""
    config = mcp_config(tmp_path / "store", preload=False, **server)
    list_tools = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    foreign = {"Host": "gpu-box.lan:8000", "Origin": "http://gpu-box.lan:8000"}
    async with live_server(create_app(config)) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post("/mcp", json=list_tools, headers={**HEADERS, **foreign})
    assert response.status_code == 200, response.text
    assert "chat" in {tool["name"] for tool in response.json()["result"]["tools"]}
