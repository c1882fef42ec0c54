"""PiperBackend: Piper ONNX voices for text-to-speech."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.requirements import require_engine
from modelpool.backends.threads import EngineThread, drain
from modelpool.capabilities import Capabilities
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import SpeechRequest, Voice
from modelpool.tasks import Task

DEFAULT_SAMPLE_RATE = 22050


class PiperOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    use_cuda: bool = False
    """Run the ONNX model on CUDA (needs onnxruntime-gpu)."""
    max_input_chars: int = Field(default=4096, ge=1)
    """Longest `input` accepted; longer gets 400."""


class PiperBackend(DeclaredBackend):
    Options = PiperOptions
    capabilities = Capabilities(tasks=frozenset({Task.SPEECH}))
    overridable = frozenset({"max_input_chars"})

    def __init__(self, model: ModelConfig, options: PiperOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self._sample_rate = DEFAULT_SAMPLE_RATE
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
        self._sample_rate = int(self._voice.config.sample_rate)
        voice_config = _read_voice_config(path)
        self._speakers, self._language = _speakers_of(voice_config), _language_of(voice_config)

    async def warmup(self) -> None:
        await drain(self.synthesize(SpeechRequest("Hello.", deterministic=True)))

    async def stop(self) -> None:
        self._voice = None
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        if self._voice is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    @property
    def sample_rate(self) -> int:
        return self._sample_rate

    async def voices(self) -> list[Voice]:
        """From the voice's `.onnx.json`, without loading the ONNX model."""
        path = await locate(self.model, self.hub)
        config = await asyncio.to_thread(_read_voice_config, path)
        rate = int((config.get("audio") or {}).get("sample_rate") or DEFAULT_SAMPLE_RATE)
        language, speakers = _language_of(config), _speakers_of(config)
        if not speakers:
            return [Voice(self.model.id, language, rate)]
        return [Voice(name, language, rate, sid) for name, sid in sorted(speakers.items())]

    async def synthesize(self, request: SpeechRequest) -> AsyncGenerator[npt.NDArray[np.int16], None]:
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
        noise = 0.0 if request.deterministic else None  # None: the voice's own noise settings
        return SynthesisConfig(
            speaker_id=speaker, length_scale=1.0 / request.speed, noise_scale=noise, noise_w_scale=noise
        )

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


def _speakers_of(config: dict[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in (config.get("speaker_id_map") or {}).items()}


def _language_of(config: dict[str, Any]) -> str:
    language = config.get("language") or {}
    return str(language.get("code") or "en")
