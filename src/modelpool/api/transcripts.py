"""Transcripts in OpenAI's response formats: json, text, srt, vtt, verbose_json; and where
they are stored when the request names a `transcript_source`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from modelpool.inference import Segment
from modelpool.owner import Owner


class TranscriptSink(Protocol):
    """What the audio routes need of the transcript store. The store is the MCP server's
    (`mcp_server/transcripts.py`); the app root hands it in as `app.state.transcripts`, so
    the routes and the MCP server never import each other."""

    def add_segments(self, source_id: str, segments: Iterable[Segment], offset: float, caller: Owner) -> object:
        """Add a transcription's segments to the caller's source, their times shifted by `offset`."""


@dataclass(frozen=True)
class StoreTarget:
    """Where a transcription's segments go in the transcript store (`transcript_source`)."""

    store: TranscriptSink
    source_id: str
    start: float
    """Added to the segments' times: the source's clock at the audio's start."""
    owner: Owner
    """The caller's key: the source is that key's."""

    async def append(self, segments: list[Segment]) -> None:
        add = self.store.add_segments
        await asyncio.to_thread(add, self.source_id, segments, self.start, self.owner)  # a file append


def transcript_text(segments: list[Segment]) -> str:
    return "".join(s.text for s in segments).strip()


def verbose_json(segments: list[Segment], task: str, duration: float, with_words: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": segments[0].language if segments else "en",
        "duration": round(duration, 3),
        "text": transcript_text(segments),
        "segments": [
            {
                "id": s.id, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
                "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob,
            }
            for s in segments
        ],
    }  # fmt: skip
    if segments and segments[0].language_probability is not None:
        body["language_probability"] = round(segments[0].language_probability, 4)
    if with_words:
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
            for s in segments
            for w in s.words
        ]
    return body


def subtitles(segments: list[Segment], kind: str) -> str:
    """SubRip (srt) or WebVTT (vtt) cues, one per segment."""
    separator = "," if kind == "srt" else "."
    cues = []
    for number, segment in enumerate(segments, start=1):
        timing = f"{_clock(segment.start, separator)} --> {_clock(segment.end, separator)}"
        cue = f"{timing}\n{segment.text.strip()}\n"
        cues.append(f"{number}\n{cue}" if kind == "srt" else cue)
    body = "\n".join(cues)
    return body if kind == "srt" else f"WEBVTT\n\n{body}"


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"
