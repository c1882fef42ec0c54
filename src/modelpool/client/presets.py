"""Presets: what differs between model families and servers, written down once so that
callers never branch on backend.

A preset says which model name to send, where a server puts the reasoning text
(`reasoning_content` for vLLM/llama.cpp/modelpool, `reasoning` for Ollama/OpenRouter and
gpt-oss), how thinking is switched (`chat_template_kwargs: {enable_thinking}` for Qwen3,
a "detailed thinking on/off" system message for Llama-Nemotron, not at all for DeepSeek-R1
and gpt-oss, which always think), fields every request carries (`default_extras`), and
what the endpoint can do. An endpoint in models.yaml may override any of it.

The agent sample's presets (nemotron3_nano, cosmos_vlm, parakeet_stt, piper_tts, ...) say
what its own servers expect: vLLM served under the role's name (`llm`, `vlm`), thinking
pinned off unless asked. modelpool stands in for them when a served model carries that
name as an alias (docs/compatibility.md, "The agent sample's SDK").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Role(str, Enum):
    """What kind of client an endpoint is for (checked by make_*)."""

    LLM = "llm"
    VLM = "vlm"
    """A chat model that reads images (make_vlm; make_llm refuses it, as the agent sample's SDK does)."""
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
    SYSTEM_PROMPT = "system_prompt"
    """Llama-Nemotron's switch: a `detailed thinking on` / `detailed thinking off` line at the
    top of the system message (added as a system message when the call has none)."""


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
    tool_calls: bool = False
    """The server turns `tools` into OpenAI `tool_calls` (informational: tools are sent either way)."""
    reasoning: bool = False
    """The model writes reasoning apart from its answer (informational)."""
    video: bool = False
    """Accepts `video_url` content parts (informational: the agent sample's VLMs)."""


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
    default_extras: Mapping[str, Any] = field(default_factory=dict)
    """Fields every request carries, under the endpoint's extra_body (the agent sample pins
    `chat_template_kwargs: {enable_thinking: false}` where the template thinks by default;
    a call's `enable_thinking=True` still wins)."""
    timeout_s: float | None = None
    """The preset's request timeout (None: the endpoint's default)."""
    default_port: int | None = None
    """Where the agent sample's own server for this role listens (documentation only)."""


OPENAI_COMPAT = Preset(
    "openai_compat",
    None,
    description="Any OpenAI-compatible server; no quirks. The endpoint must name model_name.",
)

THINKING_OFF: Mapping[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
_SAMPLE_LLM = Capabilities(tool_calls=True)
_SAMPLE_VLM = Capabilities(vision=True, video=True)

AGENT_SAMPLE_PRESETS = [
    # The agent sample's xr_ai_models presets, field for field (its presets/ package and
    # README preset table): served names, reasoning field, thinking default, capabilities.
    Preset(
        "nemotron3_nano",
        Role.LLM,
        "llm",
        reasoning_fields=("reasoning", "reasoning_content"),
        thinking=Thinking.CHAT_TEMPLATE_KWARGS,
        capabilities=Capabilities(tool_calls=True, reasoning=True),
        default_extras=THINKING_OFF,
        default_port=8107,
        description="NVIDIA-Nemotron-3-Nano-30B-A3B on vLLM (nano_v3 parser): reasoning in `reasoning`; "
        "thinking off unless asked.",
    ),
    Preset(
        "llama_nemotron",
        Role.LLM,
        "llm",
        thinking=Thinking.SYSTEM_PROMPT,
        capabilities=_SAMPLE_LLM,
        default_port=8106,
        description="Llama-3.1-Nemotron-Nano-8B on vLLM: tool calls via llama3_json; thinking switched by a "
        "'detailed thinking on/off' system message.",
    ),
    Preset(
        "nemotron_omni",
        Role.LLM,
        "llm",
        reasoning_fields=("reasoning_content", "reasoning"),
        thinking=Thinking.CHAT_TEMPLATE_KWARGS,
        capabilities=Capabilities(vision=True, video=True, tool_calls=True, reasoning=True),
        default_extras=THINKING_OFF,
        default_port=8108,
        description="Nemotron-3-Nano-Omni-30B-A3B on vLLM: text, image and video in; reasoning in "
        "`reasoning_content`; thinking off unless asked.",
    ),
    Preset(
        "cosmos_vlm",
        Role.VLM,
        "vlm",
        thinking=Thinking.CHAT_TEMPLATE_KWARGS,
        capabilities=_SAMPLE_VLM,
        default_extras=THINKING_OFF,
        default_port=8100,
        description="Cosmos-Reason1-7B on vLLM (vlm-server): image and video; thinking off by default.",
    ),
    Preset(
        "cosmos3_nano_reasoner",
        Role.VLM,
        "vlm",
        thinking=Thinking.CHAT_TEMPLATE_KWARGS,
        capabilities=_SAMPLE_VLM,
        default_port=8100,
        description="Cosmos3 Nano Reasoner on vLLM (vlm-server): image and video.",
    ),
    Preset(
        "parakeet_stt",
        Role.STT,
        "stt",
        capabilities=Capabilities(verbose_json=False),
        timeout_s=30.0,
        default_port=8103,
        description="parakeet-tdt-0.6b-v3 (the sample's stt-server): English only, plain `json` transcripts; "
        "the server ignores `model`, `language` and `temperature`.",
    ),
    Preset(
        "piper_tts",
        Role.TTS,
        "tts",
        default_port=8105,
        description="Piper voices (the sample's tts/piper server); the server ignores `model`.",
    ),
    Preset(
        "magpie_tts",
        Role.TTS,
        "tts",
        default_port=8104,
        description="magpie_tts_multilingual_357m (the sample's tts/magpie server); the server ignores `model`.",
    ),
    Preset(
        "nemotron_embedding",
        Role.EMBEDDER,
        "embedding",
        description="The sample's embedding-server: OpenAI-compatible dense embeddings.",
    ),
]

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
        *AGENT_SAMPLE_PRESETS,
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
