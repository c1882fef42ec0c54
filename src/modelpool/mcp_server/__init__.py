"""The MCP server at /mcp: tools over the pool and a transcript store.

Named `mcp_server`, not `mcp`, so that it never shadows the `mcp` SDK it is built on.
"""

from __future__ import annotations

from pathlib import Path

from modelpool.config.schema import Config
from modelpool.config.sources import HubLocation


def transcript_dir(config: Config) -> Path:
    """`server.transcript_dir`, else `transcripts` under the work directory."""
    if config.server.transcript_dir is not None:
        return config.server.transcript_dir.expanduser()
    return (config.work_dir or HubLocation.work_dir).expanduser() / "transcripts"
