"""MCP tools over the transcript store, named as an XR agent stack's transcript server
names them: add_transcript, query_transcripts, list_sources, get_transcript_stats.

Each call acts for the API key that made it: it adds to that key's sources and reads only
them (every key's with the admin scope), as the HTTP routes do."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

from modelpool.mcp_server.transcripts import MAX_LIMIT, SourceStats, StoreStats, TranscriptEntry, TranscriptStore
from modelpool.owner import Owner, owner_of

SourceId = Annotated[str, Field(min_length=1, max_length=256, description="Any string: a participant, a room, ...")]
Seconds = Annotated[float, Field(description="Seconds on the source's clock (Unix time for live sources)")]


class Found(BaseModel):
    entries: list[TranscriptEntry]
    """Oldest first."""


class Sources(BaseModel):
    sources: list[SourceStats]


def caller_of(ctx: Context[Any, Any]) -> Owner:
    """The key behind an MCP call: the HTTP request that carried it was named by `RequireKeys`."""
    request = ctx.request_context.request
    return owner_of(request.scope if request is not None else {})


def add_transcript_tools(server: MCPServer[Any], store: TranscriptStore) -> None:
    async def add_transcript(
        source_id: SourceId,
        text: str,
        start: Seconds,
        end: Seconds,
        ctx: Context[Any, Any],
        speaker: str | None = None,
    ) -> TranscriptEntry:
        """Store one utterance of a source."""
        return await asyncio.to_thread(store.add, source_id, text, start, end, speaker, caller_of(ctx))

    async def query_transcripts(
        ctx: Context[Any, Any],
        source_id: SourceId | None = None,
        text: Annotated[str | None, Field(description="Only entries containing this (any case)")] = None,
        since: Annotated[float | None, Field(description="Only entries ending at or after this time")] = None,
        until: Annotated[float | None, Field(description="Only entries starting at or before this time")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="The latest this many matches")] = 100,
    ) -> Found:
        """Stored transcript entries, of one source or all, filtered; oldest first."""
        # Off the event loop: a query scans a source's entries under the store's lock.
        found = await asyncio.to_thread(store.query, source_id, text, since, until, limit, caller_of(ctx))
        return Found(entries=found)

    async def list_sources(ctx: Context[Any, Any]) -> Sources:
        """Every source with transcripts: its entry count, time span and speakers."""
        return Sources(sources=await asyncio.to_thread(store.sources, caller_of(ctx)))

    async def get_transcript_stats(ctx: Context[Any, Any]) -> StoreStats:
        """Totals over the store (sources, entries, spoken seconds, time span) and per source."""
        return await asyncio.to_thread(store.stats, caller_of(ctx))

    for tool in (add_transcript, query_transcripts, list_sources, get_transcript_stats):
        server.add_tool(tool)
