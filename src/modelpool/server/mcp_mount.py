"""`/mcp` on the app when `server.mcp` is on. The MCP SDK is the [mcp] extra, so it is
imported here and only here, at assembly: without it the server still starts (a warning
says why /mcp is off) and `/mcp` answers 501 with a JSON-RPC error naming the extra,
instead of a 404 that would look like a wrong URL."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from modelpool.config.schema import Config
from modelpool.errors import ExtraNotInstalled
from modelpool.extras import MCP
from modelpool.wire.errors import MCP_PATH

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

log = logging.getLogger("modelpool")


def add_mcp(app: FastAPI, config: Config) -> StreamableHTTPSessionManager | None:
    """Mount `/mcp`; the returned session manager must run for as long as the app serves
    (None: nothing to run)."""
    if not config.server.mcp:
        return None
    if not MCP.installed():
        log.warning("%s is off: %s (or set server.mcp: false)", MCP_PATH, MCP.missing)
        app.router.routes.append(Route(MCP_PATH, _not_installed, methods=["GET", "POST", "DELETE"]))
        return None
    from modelpool.mcp_server.server import mount_mcp

    return mount_mcp(app, config)


async def _not_installed(_: Request) -> Response:
    """Rendered by the app's error handlers, in the JSON-RPC shape `/mcp` clients read."""
    raise ExtraNotInstalled(MCP.feature, MCP.name)
