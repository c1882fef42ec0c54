"""Typed results, and the parsing of wire JSON into them.

Reasoning text is read from whichever field the endpoint's preset names (first non-empty
wins), so `.reasoning` means the same on vLLM (`reasoning_content`), Ollama (`reasoning`)
and modelpool. `raw` keeps the server's JSON for anything the SDK does not model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def parse(cls, raw: object) -> Usage | None:
        if not isinstance(raw, Mapping):
            return None
        prompt = int(raw.get("prompt_tokens") or 0)
        completion = int(raw.get("completion_tokens") or 0)
        return cls(prompt, completion, int(raw.get("total_tokens") or prompt + completion))


@dataclass(frozen=True)
class ChatResult:
    content: str
    reasoning: str
    """The model's thinking ("" when it did not think or the server does not separate it)."""
    usage: Usage | None
    finish_reason: str | None
    model: str | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class ChatDelta:
    """One piece of a streamed answer; the last chunk may carry only `usage`."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage | None
    finish_reason: str | None
    model: str | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    """One vector per input, in input order."""
    model: str | None
    usage: Usage | None


@dataclass(frozen=True)
class TranscriptSegment:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None
    """None when the server answered plain `json` (no verbose_json)."""
    duration: float | None
    segments: list[TranscriptSegment]


@dataclass(frozen=True)
class Speech:
    audio: bytes
    format: str


@dataclass(frozen=True)
class Voice:
    voice: str
    model: str | None
    language: str | None
    sample_rate: int | None


def chat_result(raw: Mapping[str, Any], reasoning_fields: Sequence[str]) -> ChatResult:
    choice = _first_choice(raw)
    message = choice.get("message") or {}
    return ChatResult(
        content=message.get("content") or "",
        reasoning=pick_reasoning(message, reasoning_fields),
        usage=Usage.parse(raw.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=raw.get("model"),
        raw=raw,
    )


def chat_delta(chunk: Mapping[str, Any], reasoning_fields: Sequence[str]) -> ChatDelta:
    choice = _first_choice(chunk)
    delta = choice.get("delta") or {}
    return ChatDelta(
        content=delta.get("content") or "",
        reasoning=pick_reasoning(delta, reasoning_fields),
        finish_reason=choice.get("finish_reason"),
        usage=Usage.parse(chunk.get("usage")),
    )


def completion(raw: Mapping[str, Any]) -> Completion:
    choice = _first_choice(raw)
    return Completion(
        text=choice.get("text") or "",
        usage=Usage.parse(raw.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=raw.get("model"),
        raw=raw,
    )


def embeddings(raw: Mapping[str, Any]) -> Embeddings:
    rows = sorted(raw.get("data") or [], key=lambda row: row.get("index", 0))
    vectors = [list(map(float, row["embedding"])) for row in rows]
    return Embeddings(vectors, raw.get("model"), Usage.parse(raw.get("usage")))


def transcript(raw: Mapping[str, Any]) -> Transcript:
    segments = [TranscriptSegment(float(s["start"]), float(s["end"]), s["text"]) for s in raw.get("segments") or []]
    duration = raw.get("duration")
    return Transcript(raw.get("text", "").strip(), raw.get("language"), None if duration is None else float(duration),
                      segments)  # fmt: skip


def voices(raw: Mapping[str, Any]) -> list[Voice]:
    return [
        Voice(str(v.get("voice") or v.get("name") or v.get("id")), v.get("model"), v.get("language"),
              v.get("sample_rate"))
        for v in raw.get("data") or raw.get("voices") or []
    ]  # fmt: skip


def pick_reasoning(message: Mapping[str, Any], fields: Sequence[str]) -> str:
    """The first non-empty reasoning field the preset names (servers disagree on the name)."""
    for name in fields:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _first_choice(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = raw.get("choices") or [{}]
    first: Mapping[str, Any] = choices[0]
    return first
