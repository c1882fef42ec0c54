"""FasterWhisperBackend: CTranslate2 Whisper models for speech-to-text. A Hugging Face
Whisper folder (`WhisperForConditionalGeneration`, e.g. a fine-tune) is converted to
CTranslate2 once, at the compute type, by the CT2 LLM backend's cached conversion."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from modelpool.audio.windows import quiet_windows
from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.ctranslate2.convert import ComputeType, ct2_folder_for, is_ct2_folder
from modelpool.backends.requirements import require_engine
from modelpool.backends.threads import EngineThread, drain, in_passing_thread
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import Segment, TranscriptionRequest, Word
from modelpool.tasks import Task

SAMPLE_RATE = 16000


class FasterWhisperOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    device: str = "auto"
    """cpu, cuda, or auto (CUDA when CTranslate2 sees a GPU)."""
    compute_type: ComputeType | None = None
    """CTranslate2 compute type; default (or auto) int8 on CPU, float16 on GPU. A Hugging
    Face Whisper converted here is quantized to it (a change converts again)."""
    cpu_threads: int = Field(default=0, ge=0)
    """Threads on the CPU (0: CTranslate2's default)."""
    beam_size: int = Field(default=1, ge=1)
    """Beam search width (1: greedy, fastest)."""
    vad_filter: bool = False
    """Skip silence with Silero VAD before decoding: long silence then yields no text
    (without it, Whisper tends to answer silence with made-up words, "you you you …")."""
    window_s: float = Field(default=120.0, ge=30)
    """Audio longer than this is transcribed a window at a time, each cut at the quietest
    100 ms before its end. faster-whisper computes the features of all it is given at once
    (~0.8 MB a second of audio, its VAD as much again), so this bounds that memory: 20
    minutes in one go took 1.1 GB."""
    languages: list[str] | None = None
    """Languages requests may name (e.g. [en] for an English-only .en model); none: every
    language the loaded model knows (faster-whisper's `supported_languages`)."""


class FasterWhisperBackend(DeclaredBackend):
    Options = FasterWhisperOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.TRANSCRIPTION}), modalities=frozenset({Modality.AUDIO}), audio_input_rate=SAMPLE_RATE
    )
    overridable = frozenset({"beam_size", "vad_filter", "cpu_threads", "compute_type"})

    @classmethod
    def capabilities_for(cls, options: FasterWhisperOptions) -> Capabilities:
        languages = tuple(sorted(options.languages)) if options.languages else None
        return replace(cls.capabilities, languages=languages)

    def __init__(self, model: ModelConfig, options: FasterWhisperOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self.work_dir = context.hub.work_dir
        self.languages = frozenset(options.languages) if options.languages else None
        self._thread = EngineThread(model.id)
        self._whisper: Any = None

    async def estimate_memory(self) -> MemoryEstimate:
        path = await locate(self.model, self.hub)
        working = files_size(path) * 2 + 64 * 1024 * 1024
        if self._device() == "cuda":  # the weights and the decoder's buffers sit on the GPU
            return MemoryEstimate(ram_bytes=64 * 1024 * 1024, gpu_bytes=working)
        return MemoryEstimate(ram_bytes=working)

    def _device(self) -> str:
        if self.options.device != "auto":
            return self.options.device.split(":")[0]
        import ctranslate2

        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"

    async def start(self) -> None:
        require_engine(self.model.id, ("faster_whisper",), "speech")
        path = await locate(self.model, self.hub)
        # On a passing thread: a pool the load leaves on the engine thread would stay idle for
        # good (CTranslate2 computes on threads of its own) and slow every other pool (threads.py).
        self._whisper = await in_passing_thread(self._load, path)
        if self.options.languages is None:  # a request naming another language gets 400
            self.languages = frozenset(self._whisper.supported_languages)

    async def warmup(self) -> None:
        import numpy as np

        silence = TranscriptionRequest(np.zeros(SAMPLE_RATE, dtype=np.float32), language=self._default_language())
        await drain(self.transcribe(silence))

    async def stop(self) -> None:
        self._whisper = None
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        if self._whisper is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    async def transcribe(self, request: TranscriptionRequest) -> AsyncGenerator[Segment, None]:
        self._check_language(request.language)
        whisper = self._whisper
        if whisper is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        async for segment in self._thread.stream(lambda cancel: self._segments(whisper, request, cancel)):
            yield segment

    def _segments(self, whisper: Any, request: TranscriptionRequest, cancel: threading.Event) -> Iterator[Segment]:
        language = request.language or self._default_language()
        detected: tuple[str, float | None] | None = None
        index = 0
        for start, end in quiet_windows(request.audio, SAMPLE_RATE, self.options.window_s):
            if cancel.is_set():  # also between windows that yield nothing (silence under the VAD)
                return
            segments, info = self._transcribe_window(whisper, request, start, end, language)
            if detected is None:  # the first window's language holds for the rest
                detected = info.language, None if language else info.language_probability
                language = info.language
            for segment in segments:  # lazy: each step decodes the next segment
                if cancel.is_set():
                    return
                yield _segment(index, segment, *detected, offset=start / SAMPLE_RATE)
                index += 1

    def _transcribe_window(
        self, whisper: Any, request: TranscriptionRequest, start: int, end: int, language: str | None
    ) -> tuple[Any, Any]:
        task = "transcribe" if self.languages == frozenset({"en"}) else request.task  # English-only: already English
        return whisper.transcribe(  # type: ignore[no-any-return]
            request.audio[start:end],
            language=language,
            task=task,
            initial_prompt=request.prompt or None,
            temperature=request.temperature,
            word_timestamps=request.word_timestamps,
            beam_size=self.options.beam_size,
            vad_filter=self.options.vad_filter,
        )

    def _load(self, source: Path) -> Any:
        """Convert a Hugging Face folder (once), then load the CT2 one."""
        from faster_whisper import WhisperModel

        device = self.options.device if self.options.device != "auto" else self._device()
        compute_type = whisper_compute_type(self.options.compute_type, device)
        try:
            folder = ct2_whisper_folder(source, self.work_dir, compute_type)
        except ModelLoadFailed as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': {exc.message}") from exc
        try:
            return WhisperModel(
                str(folder), device=device, compute_type=compute_type, cpu_threads=self.options.cpu_threads
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': faster-whisper could not load {folder}: {exc}") from exc

    def _check_language(self, language: str | None) -> None:
        if language is not None and self.languages is not None and language not in self.languages:
            raise InvalidRequest(
                f"model '{self.model.id}' understands only {', '.join(sorted(self.languages))}, not '{language}'",
                param="language",
            )

    def _default_language(self) -> str | None:
        return next(iter(self.languages)) if self.languages is not None and len(self.languages) == 1 else None


def whisper_compute_type(chosen: ComputeType | None, device: str) -> str:
    """A concrete compute type, which a converted folder is quantized to and named by (the
    converter takes no `auto`): the option's, else int8 on the CPU and float16 on a GPU."""
    return chosen if chosen is not None and chosen != "auto" else ("int8" if device == "cpu" else "float16")


def ct2_whisper_folder(source: Path, work_dir: Path, compute_type: str) -> Path:
    """The CT2 folder faster-whisper loads: `source` itself, or a Hugging Face Whisper
    converted once (cached under `work_dir`). A Hugging Face folder must carry its
    `tokenizer.json`: CTranslate2 converts without it, and faster-whisper would then fetch
    openai's tokenizer from the hub, which need not be this model's (or reachable)."""
    if not is_ct2_folder(source) and source.is_dir() and not (source / "tokenizer.json").is_file():
        raise ModelLoadFailed(
            f"{source} has no tokenizer.json: a Hugging Face Whisper folder needs its fast tokenizer "
            "(transformers writes it with the tokenizer's save_pretrained)"
        )
    return ct2_folder_for(source, work_dir, compute_type)


def _segment(index: int, segment: Any, language: str, language_probability: float | None, *, offset: float) -> Segment:
    """A faster-whisper segment of a window that starts `offset` seconds into the audio."""
    words = tuple(Word(w.start + offset, w.end + offset, w.word, w.probability) for w in segment.words or ())
    return Segment(
        id=index,
        start=segment.start + offset,
        end=segment.end + offset,
        text=segment.text,
        words=words,
        avg_logprob=segment.avg_logprob,
        no_speech_prob=segment.no_speech_prob,
        compression_ratio=segment.compression_ratio,
        temperature=segment.temperature or 0.0,
        tokens=tuple(segment.tokens),
        language=language,
        language_probability=language_probability,
    )
