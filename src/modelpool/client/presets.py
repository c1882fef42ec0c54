"""Presets: what differs between model families and servers, written down once so that
callers never branch on backend.

A preset says which model name to send, where a server puts the reasoning text
(`reasoning_content` for vLLM/llama.cpp/modelpool, `reasoning` for Ollama/OpenRouter and
gpt-oss), how thinking is switched (`chat_template_kwargs: {enable_thinking}` for Qwen3,
not at all for DeepSeek-R1 and gpt-oss, which always think), and what the endpoint can do.
An endpoint in models.yaml may override any of it (`model_name`, `capabilities`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Role(str, Enum):
    """What kind of client an endpoint is for (checked by make_*)."""

    LLM = "llm"
    EMBEDDER = "embedder"
    RERANKER = "reranker"
    STT = "stt"
    TTS = "tts"


class Thinking(str, Enum):
    """How `enable_thinking` reaches the model."""

    NONE = "none"
    """No switch: the field is left out of the request entirely."""
    CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"
    """Sent as `chat_template_kwargs: {enable_thinking: bool}` (vLLM, SGLang, llama.cpp, modelpool)."""
    ALWAYS = "always"
    """The model always thinks; `enable_thinking=False` is ignored (nothing can turn it off)."""


@dataclass(frozen=True)
class Capabilities:
    vision: bool = False
    """Accepts `image_url` content parts (make_vlm refuses endpoints without it)."""
    streaming: bool = True
    """Answers `stream: true` with server-sent events."""
    stream_usage: bool = True
    """Honours `stream_options: {include_usage: true}` (a last chunk with token counts)."""
    verbose_json: bool = True
    """Transcriptions in `verbose_json` (language, duration, segments); else plain `json`."""


STANDARD_REASONING_FIELDS = ("reasoning_content", "reasoning")
DEFAULT_HEALTH_PATHS = ("/readyz", "/health", "/v1/models")
"""Probed in order; a 404 moves on to the next (modelpool, llama-server/vLLM, anything OpenAI-shaped)."""


@dataclass(frozen=True)
class Preset:
    name: str
    role: Role | None
    """The client kind it serves; None: any (the generic `openai_compat`)."""
    model_name: str | None = None
    """The served model name; None: the endpoint must say (`model_name:`), as it depends on the deployment."""
    reasoning_fields: tuple[str, ...] = STANDARD_REASONING_FIELDS
    """Message/delta fields that hold reasoning text, first non-empty wins."""
    thinking: Thinking = Thinking.NONE
    health_paths: tuple[str, ...] = DEFAULT_HEALTH_PATHS
    capabilities: Capabilities = field(default_factory=Capabilities)
    description: str = ""


OPENAI_COMPAT = Preset(
    "openai_compat",
    None,
    description="Any OpenAI-compatible server; no quirks. The endpoint must name model_name.",
)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in [
        Preset(
            "smollm2",
            Role.LLM,
            "smollm2-135m-instruct",
            description="modelpool's starter chat model (SmolLM2-135M-Instruct, llama.cpp).",
        ),
        Preset(
            "qwen3",
            Role.LLM,
            reasoning_fields=("reasoning_content", "reasoning"),
            thinking=Thinking.CHAT_TEMPLATE_KWARGS,
            description="Qwen3: thinking toggled by the chat template's enable_thinking.",
        ),
        Preset(
            "deepseek-r1",
            Role.LLM,
            reasoning_fields=("reasoning_content", "reasoning"),
            thinking=Thinking.ALWAYS,
            description="DeepSeek-R1 (and its distills): always thinks; enable_thinking=False is ignored.",
        ),
        Preset(
            "gpt-oss",
            Role.LLM,
            reasoning_fields=("reasoning", "reasoning_content"),
            thinking=Thinking.ALWAYS,
            description="gpt-oss: reasoning in `reasoning` (Ollama, OpenRouter) or `reasoning_content` (vLLM); "
            "always reasons.",
        ),
        Preset("minilm", Role.EMBEDDER, "all-minilm-l6-v2", description="all-MiniLM-L6-v2, 384-dim embeddings."),
        Preset(
            "bge-reranker",
            Role.RERANKER,
            "bge-reranker-v2-m3",
            description="BAAI/bge-reranker-v2-m3 cross-encoder (the reranker config of docs/engines.md); scores 0..1.",
        ),
        Preset("whisper", Role.STT, "whisper-tiny.en", description="Whisper tiny.en (English only) on modelpool."),
        Preset(
            "whisper-base",
            Role.STT,
            "whisper-base",
            description="Whisper base on modelpool: 99 languages, auto-detected; translation into English.",
        ),
        Preset("piper", Role.TTS, "piper-en-us-joe", description="Piper en_US joe (22.05 kHz) on modelpool."),
        Preset(
            "kokoro",
            Role.TTS,
            "kokoro-82m",
            description="Kokoro-82M (24 kHz) on modelpool: five voices, Japanese and English (`language`).",
        ),
    ]
}


def find_preset(kind: str) -> Preset:
    """The preset that an endpoint's `kind` names: `preset:NAME` or `openai_compat`."""
    if kind == OPENAI_COMPAT.name:
        return OPENAI_COMPAT
    prefix, _, name = kind.partition(":")
    if prefix != "preset" or not name:
        raise ValueError(f"kind must be 'openai_compat' or 'preset:NAME', not {kind!r}")
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown preset {name!r} (known presets: {known})") from None
