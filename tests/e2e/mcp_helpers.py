"""What the MCP tests share: a config for a served app, and the official MCP client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from modelpool.config import Config, load_config
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL

POOL_MODELS = [CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL]


def mcp_config(
    store: Path, media: Path | None = None, *, preload: bool = True, more: dict[str, Any] | None = None, **server: Any
) -> Config:
    """The starter models an MCP client can use (and `more` models), the transcript store in
    `store`, audio files readable under `media`, and more `server` settings."""
    server = {"transcript_dir": str(store), "allowed_local_media_dirs": [str(media)] if media else [], **server}
    models = {**{model: {"preload": preload} for model in POOL_MODELS}, **(more or {})}
    cli = {"server": server, "enabled_models": list(models), "models": models}
    return load_config(None, cli=cli, environ={})


@contextlib.asynccontextmanager
async def mcp_client(base_url: str, key: str | None = None, **options: Any) -> AsyncIterator[Client]:
    """The SDK's client on `{base_url}/mcp`, sending `key` as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120)) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http), **options) as client,
    ):
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; a failed call fails the test with its message."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    # The text block a client without structured output reads holds the same JSON.
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


def text_of(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))
