"""PiperBackend: Piper ONNX voices for text-to-speech."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.base import Limits, MemoryEstimate, SpeechRequest, Voice
from modelpool.backends.requirements import require_engine
from modelpool.backends.threads import EngineThread, drain
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation, files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.tasks import Task


class PiperOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    use_cuda: bool = False
    """Run the ONNX model on CUDA (needs onnxruntime-gpu)."""
    max_input_chars: int = Field(default=4096, ge=1)
    """Longest `input` accepted; longer gets 400."""


class PiperBackend:
    Options = PiperOptions
    supported_tasks = frozenset({Task.SPEECH})
    overridable = frozenset({"max_input_chars"})

    def __init__(self, model: ModelConfig, options: PiperOptions, hub: HubLocation) -> None:
        self.model = model
        self.options = options
        self.hub = hub
        self.tasks = self.supported_tasks
        self.limits = Limits(max_concurrency=1)
        self.sample_rate = 22050
        self._thread = EngineThread(model.id)
        self._voice: Any = None
        self._speakers: dict[str, int] = {}
        self._language = "en"

    async def estimate_memory(self) -> MemoryEstimate:
        path = await locate(self.model, self.hub)
        return MemoryEstimate(ram_bytes=files_size(path) * 3 + 32 * 1024 * 1024)

    async def start(self) -> None:
        require_engine(self.model.id, ("piper",), "speech")
        path = await locate(self.model, self.hub)
        self._voice = await self._thread.call(self._load, path)
        config = self._voice.config
        self.sample_rate = int(config.sample_rate)
        speakers = _read_speakers(path)
        self._speakers = speakers
        self._language = _read_language(path)

    async def warmup(self) -> None:
        await drain(self.synthesize(SpeechRequest("Hello.", deterministic=True)))

    async def stop(self) -> None:
        self._voice = None
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        if self._voice is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    def voices(self) -> list[Voice]:
        if not self._speakers:
            return [Voice(self.model.id, self._language, self.sample_rate)]
        return [Voice(name, self._language, self.sample_rate, sid) for name, sid in sorted(self._speakers.items())]

    async def synthesize(self, request: SpeechRequest) -> AsyncIterator[npt.NDArray[np.int16]]:
        if len(request.text) > self.options.max_input_chars:
            raise InvalidRequest(f"input is over {self.options.max_input_chars} characters", param="input")
        config = self._config(request)
        voice = self._voice
        if voice is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        async for pcm in self._thread.stream(lambda cancel: _sentences(voice, request.text, config, cancel)):
            yield pcm

    def _config(self, request: SpeechRequest) -> Any:
        from piper import SynthesisConfig

        speaker = self._speaker_id(request.voice)
        noise = {"noise_scale": 0.0, "noise_w_scale": 0.0} if request.deterministic else {}
        return SynthesisConfig(speaker_id=speaker, length_scale=1.0 / request.speed, **noise)

    def _speaker_id(self, voice: str | None) -> int | None:
        if voice is None or not self._speakers:
            return None  # a single-speaker voice answers to any voice name (OpenAI's alloy, ...)
        if voice not in self._speakers:
            raise InvalidRequest(
                f"model '{self.model.id}' has no voice '{voice}' (it has: {', '.join(sorted(self._speakers))})",
                param="voice",
            )
        return self._speakers[voice]

    def _load(self, path: Path) -> Any:
        from piper import PiperVoice

        try:
            return PiperVoice.load(str(path), use_cuda=self.options.use_cuda)
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': piper could not load {path}: {exc}") from exc


def _sentences(voice: Any, text: str, config: Any, cancel: threading.Event) -> Iterator[npt.NDArray[np.int16]]:
    for chunk in voice.synthesize(text, config):  # piper yields one chunk per sentence
        if cancel.is_set():
            return
        yield np.asarray(chunk.audio_int16_array, dtype=np.int16).reshape(-1)


def _read_voice_config(path: Path) -> dict[str, Any]:
    config = path.with_name(path.name + ".json")
    return json.loads(config.read_text("utf-8")) if config.is_file() else {}


def _read_speakers(path: Path) -> dict[str, int]:
    return {str(k): int(v) for k, v in (_read_voice_config(path).get("speaker_id_map") or {}).items()}


def _read_language(path: Path) -> str:
    language = _read_voice_config(path).get("language") or {}
    return str(language.get("code") or "en")
