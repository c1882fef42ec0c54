"""Tool calls from their streamed pieces."""

from __future__ import annotations

from collections.abc import Iterable

from modelpool.inference import ToolCall, ToolCallDelta


def assemble_calls(deltas: Iterable[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """The whole calls that streamed `deltas` make, by index: id and name from the first
    piece that has them, the arguments' pieces joined in order."""
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        arguments.setdefault(delta.index, []).append(delta.arguments)
        if delta.id is not None:
            ids.setdefault(delta.index, delta.id)
        if delta.name is not None:
            names.setdefault(delta.index, delta.name)
    return tuple(
        ToolCall(ids.get(index, ""), names.get(index, ""), "".join(arguments[index])) for index in sorted(arguments)
    )


def merge_deltas(deltas: Iterable[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """Pieces that follow one another in the same call, joined: one chunk then carries
    at most one piece per call, as OpenAI's streams do."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if last is not None and last.index == delta.index and delta.id is None and delta.name is None:
            merged[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + delta.arguments)
        else:
            merged.append(delta)
    return tuple(merged)
