"""What a load run sends and how much of it, checked before anything is sent."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

Kind = Literal["chat", "completion", "embeddings", "transcription", "speech"]
KINDS: tuple[Kind, ...] = get_args(Kind)

# Bounds: past these a run is a mistake (or an attack on someone's server), not a benchmark.
MAX_CONCURRENCY = 1024
MAX_LEVELS = 32
MAX_REQUESTS = 1_000_000
MAX_DURATION_S = 24 * 3600.0
MAX_WARMUP = 10_000
MAX_TOKENS = 1_000_000
MAX_TIMEOUT_S = 3600.0
MAX_PROMPTS = 100_000
MAX_PROMPT_CHARS = 1_000_000
MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's own limit for an uploaded audio file

PATHS: Mapping[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "transcription": "/v1/audio/transcriptions",
    "speech": "/v1/audio/speech",
}


class LoadSpecError(ValueError):
    """A setting out of its bounds; the message names the setting."""


@dataclass(frozen=True)
class LoadSpec:
    """One kind of request against one model at one URL. `api_key` is never printed (repr)."""

    base_url: str
    model: str
    kind: Kind = "chat"
    prompts: tuple[str, ...] = ("Write a short story about a lighthouse keeper and a storm.",)
    max_tokens: int = 64
    stream: bool = True
    ignore_eos: bool = False  # vLLM's and llama-server's (and modelpool's) extra; others ignore it
    temperature: float | None = 0.0
    timeout_s: float = 300.0  # a request's whole time, connect to last byte
    api_key: str | None = field(default=None, repr=False)
    audio: bytes = field(default=b"", repr=False)  # a WAV file, for transcription
    audio_name: str = "audio.wav"
    voice: str = "alloy"
    keepalive_s: float = 2.0  # llama-server closes idle connections after 5 s: reuse them sooner
    extra_body: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise LoadSpecError(f"url: {self.base_url!r} is not an http:// or https:// URL")
        if not self.model or len(self.model) > 512:
            raise LoadSpecError("model: give the model's id (1 to 512 characters)")
        if self.kind not in KINDS:
            raise LoadSpecError(f"kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.prompts or len(self.prompts) > MAX_PROMPTS:
            raise LoadSpecError(f"prompts: between 1 and {MAX_PROMPTS} prompts")
        if any(not p or len(p) > MAX_PROMPT_CHARS for p in self.prompts):
            raise LoadSpecError(f"prompts: each prompt 1 to {MAX_PROMPT_CHARS} characters")
        _bounded("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        _bounded("timeout", self.timeout_s, 0.001, MAX_TIMEOUT_S)
        if self.kind == "transcription" and not 44 <= len(self.audio) <= MAX_AUDIO_BYTES:
            raise LoadSpecError(f"audio: a transcription needs a WAV file of 44 bytes to {MAX_AUDIO_BYTES} bytes")

    def url(self) -> str:
        """The kind's endpoint; the base may be given with or without its `/v1`."""
        base = self.base_url.rstrip("/")
        base = base.removesuffix("/v1")
        return base + PATHS[self.kind]


@dataclass(frozen=True)
class LoadPlan:
    """How much load: concurrency levels (a sweep), each for `requests` or `duration_s`."""

    concurrency: tuple[int, ...] = (1,)
    requests: int | None = 32
    duration_s: float | None = None
    warmup: int = 1

    def __post_init__(self) -> None:
        if not self.concurrency or len(self.concurrency) > MAX_LEVELS:
            raise LoadSpecError(f"concurrency: 1 to {MAX_LEVELS} levels")
        for level in self.concurrency:
            _bounded("concurrency", level, 1, MAX_CONCURRENCY)
        if (self.requests is None) == (self.duration_s is None):
            raise LoadSpecError("requests/duration: give exactly one of them")
        if self.requests is not None:
            _bounded("requests", self.requests, 1, MAX_REQUESTS)
        if self.duration_s is not None:
            _bounded("duration", self.duration_s, 0.001, MAX_DURATION_S)
        _bounded("warmup", self.warmup, 0, MAX_WARMUP)


def _bounded(name: str, value: float, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise LoadSpecError(f"{name}: {value!r} is not a number")
    if not low <= value <= high:
        raise LoadSpecError(f"{name}: {value} is out of bounds ({low:g} to {high:g})")


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,4,16` → (1, 4, 16); a bad item names itself."""
    levels = []
    for item in text.split(","):
        try:
            levels.append(int(item.strip()))
        except ValueError:
            raise LoadSpecError(f"concurrency: {item.strip()!r} is not a whole number (give e.g. 1,4,16)") from None
    return tuple(levels)
