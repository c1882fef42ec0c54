"""What a backend can do, declared once on its class as data, and what one model does.

A backend class says `capabilities = Capabilities(...)`: the most it can ever do. Where its
options change that (a llama-server started for embeddings does not chat; `parallel: 8`
runs eight requests at once), the class narrows it in `capabilities_for(options)`. The
registry then resolves one model's `ModelCapabilities` from that and the model's config, by
one rule in one place (`resolve`), and the runtime checks at load that the backend really
implements what it claims. `/v1/models` shows the result, so clients decide from data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from modelpool.inference import DEFAULT_MAX_BEAM_TOKENS
from modelpool.tasks import Task


class Modality(str, Enum):
    """Kinds of input a model takes."""

    TEXT = "text"
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


class Locality(str, Enum):
    """Where the engine runs, which decides what the pool can know and must guard."""

    IN_PROCESS = "in_process"
    """Inside modelpool: its memory is modelpool's."""
    ENGINE_PROCESS = "engine_process"
    """A process modelpool starts and supervises: it can crash, has output and its own memory."""
    REMOTE = "remote"
    """Elsewhere: requests pass the `allow_remote` gate; it costs no local memory."""


TEXT_ONLY = frozenset({Modality.TEXT})
GENERATION_TASKS = frozenset({Task.CHAT, Task.COMPLETION})


@dataclass(frozen=True)
class Capabilities:
    """A backend class's declaration. Every field has a meaning a client or the runtime acts on."""

    tasks: frozenset[Task]
    """Every task the backend can serve. A model's `tasks:` must stay within these."""
    default_tasks: frozenset[Task] | None = None
    """Served when the model's config names no `tasks:` (None: all of `tasks`)."""
    modalities: frozenset[Modality] = TEXT_ONLY
    """Input modalities the backend accepts."""
    tools: bool = False
    """Chat requests may carry `tools` and get `tool_calls` back."""
    structured_output: bool = False
    """`response_format` with a JSON schema is honoured."""
    prompt_scoring: bool = False
    """Completions with `echo` and `logprobs` score the prompt's own tokens (lm-eval)."""
    streaming: bool = True
    """Results arrive as they are produced (generation, transcription, speech)."""
    engine_concurrency: int = 1
    """Requests one engine (one replica) runs at once: 1 for one llama.cpp context."""
    context_length: int | None = None
    """Most tokens a prompt plus its completion may hold, when the backend knows it up front."""
    locality: Locality = Locality.IN_PROCESS
    needs_source: bool = True
    """The model's config must say where its weights are (`source:`)."""
    audio_input_rate: int | None = None
    """Transcription: the sample rate (Hz) uploads are decoded to before they reach the backend."""
    languages: tuple[str, ...] | None = None
    """Speech models: the languages understood or spoken (None: whatever the model knows)."""
    max_images: int | None = None
    """Image models: most images one request may carry (None: no limit known here)."""
    image_urls_upstream: bool = False
    """Forwarding backends: the upstream fetches `http(s)://` image URLs itself, so they are
    sent as they are rather than fetched (and checked) by modelpool."""
    video_fps: float | None = None
    """In-process video models: frames a second a video is sampled into (with
    `max_video_frames`); None: a video is forwarded whole to the engine or upstream."""
    max_video_frames: int | None = None
    """In-process video models: most frames one video is sampled into."""
    max_beam_size: int = 0
    """Widest beam search a request may ask (`decoding.beam_size`, `beam_size` on the
    completions routes), run as the engine's own; 0: the engine has none."""
    max_beam_tokens: int = DEFAULT_MAX_BEAM_TOKENS
    """Longest answer (`max_tokens`) a beam search request may ask; a beam request that
    sets none is cut there. Meaningful with `max_beam_size`."""
    tokenizer: bool = False
    """The model's tokenizer is reachable here (POST /tokenize, /detokenize): the backend
    implements `TokenizerBackend`, checked at load like a task's Protocol."""
    adapters: bool = False
    """LoRA adapters (a model's `adapters:`) are served: chosen per request, loaded on demand."""
    thinking_in_template: bool = False
    """`thinking` reaches the engine as its chat template's `enable_thinking`
    (`chat_template_kwargs`), and the engine splits the reasoning from the answer itself
    (vLLM's and llama-server's reasoning parsers, an upstream's `reasoning_content`): the
    model's `thinking_modes` need no `reasoning_parser` here."""

    def served_tasks(self, asked: frozenset[Task] | None) -> frozenset[Task]:
        """The tasks a model serves: what its config asks, within `tasks`; else the default."""
        if asked is None:
            return self.default_tasks if self.default_tasks is not None else self.tasks
        return asked


@dataclass(frozen=True)
class ModelCapabilities:
    """What one configured model does: its backend's capabilities, resolved with its config."""

    tasks: frozenset[Task]
    declared: Capabilities
    thinking_modes: tuple[str, ...] = ()
    """Values of `thinking` that change what the model does (`default`, `enabled`, `disabled`)."""
    overridable: frozenset[str] = frozenset()
    """Backend option names an admin may change for one load."""
    thinking_default: bool | None = None
    """The model's configured `enable_thinking`: what a request that does not say gets
    (None: the chat template's own default)."""

    @property
    def remote(self) -> bool:
        return self.declared.locality is Locality.REMOTE

    @property
    def multi_turn(self) -> bool:
        return Task.CHAT in self.tasks

    def as_json(self) -> dict[str, Any]:
        """The `capabilities` object of `/v1/models` and the admin API."""
        declared = self.declared
        generates = bool(self.tasks & GENERATION_TASKS)
        return {
            "tasks": sorted(task.value for task in self.tasks),
            "modalities": sorted(modality.value for modality in declared.modalities),
            "multi_turn": self.multi_turn,
            "thinking_modes": list(self.thinking_modes),
            "thinking_default": self.thinking_default,
            "tools": declared.tools and Task.CHAT in self.tasks,
            "structured_output": declared.structured_output and generates,
            "prompt_scoring": declared.prompt_scoring and Task.COMPLETION in self.tasks,
            "rerank": bool(self.tasks & {Task.RERANK, Task.EMBEDDING}),  # embeddings rerank by cosine
            "streaming": declared.streaming,
            "engine_concurrency": declared.engine_concurrency,
            "context_length": declared.context_length,
            "locality": declared.locality.value,
            "remote": self.remote,
            "needs_source": declared.needs_source,
            "audio_input_rate": declared.audio_input_rate,
            "languages": list(declared.languages) if declared.languages is not None else None,
            "max_images": declared.max_images if Modality.IMAGE in declared.modalities else None,
            "tokenizer": declared.tokenizer,
            "beam_search": declared.max_beam_size > 1 and generates,
            "max_beam_size": declared.max_beam_size if declared.max_beam_size > 1 and generates else None,
            "adapters": declared.adapters and generates,
        }
