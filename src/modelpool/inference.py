"""The data of inference work that every layer shares: requests, streamed chunks and results.

Plain frozen dataclasses with no behaviour and no engine imports: the API builds them from
wire bodies, the runtime routes them, backends consume and produce them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

DEFAULTED = frozenset({"max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty"})
"""Sampling fields a model's config may give defaults for (`models: <id>: sampling:`)."""


MAX_BEAM_SIZE = 64
"""Widest beam search any request may ask (`beam_size`), whatever a model's options allow:
each beam is a whole sequence's work and KV cache, so memory and time grow with the width.
A model's own limit (its engine's `max_beam_size` option, 16 by default) is usually lower."""
DEFAULT_MAX_BEAM_SIZE = 16
"""The `max_beam_size` option's default on the engines that have beam search."""
MAX_BEAM_TOKENS = 4096
"""Longest answer any beam search may run to (`max_tokens`), whatever a model's options
allow: a search cannot be stopped once started (CTranslate2's runs to its end when the
client leaves, the model unloads or the server stops; transformers' holds the engine thread,
every other stream waiting), and its work grows with length × width."""
DEFAULT_MAX_BEAM_TOKENS = 512
"""The `max_beam_tokens` option's default on the engines that have beam search."""


@dataclass(frozen=True)
class BeamSearch:
    """Decode with the engine's own beam search rather than token by token: the
    hypothesis that scores best over the whole answer. Deterministic: it never samples."""

    width: int
    """Beams kept at each step (2 .. the model's `max_beam_size`)."""
    length_penalty: float = 1.0
    """A hypothesis's log-probability is divided by its length to this power before
    hypotheses are compared (CTranslate2's and transformers' same definition)."""
    param: str = "beam_size"
    """Where the request asked for it (`decoding.beam_size`), for errors about it."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    """None: until end of sequence or the context is full."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """None: no logprobs; N ≥ 0: the chosen token's logprob plus N top alternatives."""
    ignore_eos: bool = False
    """Never end at the model's end-of-sequence token: generate until max_tokens (vLLM's name)."""
    min_tokens: int = 0
    """Neither end-of-sequence nor a stop sequence ends the generation before this many
    tokens (vLLM's name)."""
    beam: BeamSearch | None = None
    """Beam search instead of sampling (None: sample, or greedy at temperature 0)."""
    unset: frozenset[str] = frozenset()
    """Fields the client left out (among `DEFAULTED`): the pool fills them with the model's
    configured sampling defaults when it receives the request; engines never see any."""


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text, as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call, as OpenAI streams them: the first piece of call
    `index` carries its id and name, later pieces carry more of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ImageInput:
    """An image part of a message, as the client sent it, and once the pool has loaded it
    (the backend then sees `image`, a decoded RGB PIL image, and `data_uri`)."""

    url: str
    """data:, http(s): or file: (as sent)."""
    param: str
    """Where it was in the request (`messages[0].content[1]`), for errors about it."""
    detail: str | None = None
    image: Any = None
    data_uri: str | None = None
    """The image's bytes as a data URI, for forwarding (None: forwarded by its URL)."""


@dataclass(frozen=True)
class VideoInput:
    """A video part of a message (`video_url`), as the client sent it, and once the pool has
    loaded it: sampled into `frames` (RGB PIL images at `timestamps` seconds) for a model
    that reads frames in process, or kept whole as `data_uri` for an engine or upstream
    that takes the video itself."""

    url: str
    """data:, http(s): or file: (as sent)."""
    param: str
    """Where it was in the request (`messages[0].content[1]`), for errors about it."""
    frames: tuple[Any, ...] = ()
    timestamps: tuple[float, ...] = ()
    fps: float = 0.0
    """The video's own frame rate (0: unknown)."""
    data_uri: str | None = None
    """The video's bytes as a data URI, for forwarding (None: forwarded by its URL)."""


@dataclass(frozen=True)
class TextPart:
    text: str


ContentPart = TextPart | ImageInput | VideoInput


@dataclass(frozen=True)
class ChatMessage:
    role: str
    """system, user, assistant, or tool."""
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls an assistant message made (history sent back by the client)."""
    tool_call_id: str | None = None
    """For a `tool` message: the call whose result it carries."""
    parts: tuple[ContentPart, ...] = ()
    """Set when the message carries images or videos: its text and media in order (`content`
    holds the text alone)."""

    @property
    def images(self) -> tuple[ImageInput, ...]:
        return tuple(part for part in self.parts if isinstance(part, ImageInput))

    @property
    def videos(self) -> tuple[VideoInput, ...]:
        return tuple(part for part in self.parts if isinstance(part, VideoInput))


@dataclass(frozen=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments object."""


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None
    """The function that must be called (mode `function`)."""


@dataclass(frozen=True)
class OutputFormat:
    """What the output must be (`response_format`): any JSON object, or JSON matching `schema`."""

    kind: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    name: str = "response"
    """The schema's name (forwarded to upstreams, which may require one)."""


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = SamplingParams()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template (enable_thinking, source_lang_code, ...)."""
    streamed: bool = True
    """The client reads the answer as it comes. False: it wants it whole, so a forwarding
    backend asks its upstream for one response (cheaper for most servers, and the only way
    some of them report usage). Local engines ignore it."""
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    """More than one call in one reply."""
    output: OutputFormat | None = None
    adapter: str | None = None
    """The model's LoRA adapter (a name from its `adapters:`) this request runs with; None: the base model."""


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    """Text, or token ids in the model's own vocabulary."""
    sampling: SamplingParams = SamplingParams()
    echo: bool = False
    streamed: bool = True
    """As `ChatRequest.streamed`."""
    output: OutputFormat | None = None
    adapter: str | None = None
    """As `ChatRequest.adapter`."""


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float | None
    """None for the first token of an echoed prompt: nothing came before it."""
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()
    greedy: bool = True
    """The token is the most likely one at its position (always, for the first)."""
    token_id: int = -1


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Speculation:
    """A generation's speculative decoding (a draft model's guesses): how many the model
    checked and how many it agreed with."""

    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class GenerationChunk:
    """A piece of generated text. The last chunk of a generation has `finish_reason`
    ('stop' or 'length') and `usage` set."""

    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning: str = ""
    """Reasoning text (models with a reasoning parser); `text` is then the answer only."""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    """Pieces of the tool calls the model is making ('tool_calls' is then the finish reason)."""
    stop_sequence: str | None = None
    """On the last chunk: the stop sequence that ended the generation (finish reason
    'stop'), when the engine knows it; None when end-of-sequence ended it (Anthropic's
    API tells the two apart: `stop_sequence` vs `end_turn`)."""
    prompt_tokens: int | None = None
    """The first chunk of a local engine: the prompt's token count, known once it is admitted
    (before any token is generated), for protocols that report it up front (Anthropic's
    `message_start`). The last chunk's `usage` stays the count to rely on."""
    prompt_seconds: float | None = None
    """On the chunk that has `prompt_tokens`, where the engine measures it: the seconds its
    backend spent rendering the chat template and tokenizing the prompt (the request
    timing's `tokenize_s`, llm-pool's `engine_tokenize_ms`)."""
    token_count: int = 0
    """Generated tokens this chunk accounts for: a local engine's tokens since its chunk
    before (some make no text of their own: held back for a stop sequence, or half a
    character), a streamed upstream's event (one token each, as llama.cpp and vLLM send
    them); 0 where unknown. Counted as they pass, so a generation cut off before its last
    chunk's `usage` is still charged the output it produced."""
    speculation: Speculation | None = None
    """On the last chunk, where a draft model guessed tokens: its guesses checked and accepted."""


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: tuple[str | tuple[int, ...], ...]
    """Texts, or token-id sequences in the model's own vocabulary (no special tokens)."""
    truncate: bool = False
    """Cut over-long inputs to the model's maximum instead of rejecting them."""


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: npt.NDArray[np.float32]
    """Shape (len(inputs), dimensions), in input order."""
    prompt_tokens: int
    token_counts: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class PairScoreRequest:
    """Relevance scores of text pairs: (query, document) for rerank, (text_1, text_2) for score."""

    pairs: tuple[tuple[str, str], ...]
    truncate: bool = False
    """Cut an over-long pair to the model's maximum instead of rejecting it."""
    params: tuple[tuple[str, str], ...] = ()
    """Where each pair's texts were in the request (`query`, `documents[3]`), for errors."""

    def param(self, index: int, side: int = 1) -> str | None:
        """The field of pair `index`'s first (side 0) or second text (side 1)."""
        return self.params[index][side] if index < len(self.params) else None


@dataclass(frozen=True)
class PairScores:
    scores: tuple[float, ...]
    """One per pair, in order: a cross-encoder's score, or the cosine of two embeddings."""
    prompt_tokens: int


@dataclass(frozen=True)
class EncodedPair:
    """A text pair as a cross-encoder's tokenizer encodes it: each model input (`input_ids`,
    `attention_mask`, `token_type_ids`, ...) as token-wise values, ready to be padded into a batch."""

    features: Mapping[str, tuple[int, ...]]

    def __len__(self) -> int:
        return len(self.features["input_ids"])


@dataclass(frozen=True)
class TranscriptionRequest:
    audio: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    """Mono samples at the backend's declared `audio_input_rate` (the pool decodes uploads into it)."""
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    word_timestamps: bool = False
    task: str = "transcribe"
    """transcribe, or translate (into English)."""


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True)
class Segment:
    id: int
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 0.0
    temperature: float = 0.0
    tokens: tuple[int, ...] = ()
    language: str = "en"
    language_probability: float | None = None
    """How sure language detection was of `language` (None: given by the request, or unknown)."""


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: str | None = None
    speed: float = 1.0
    deterministic: bool = False
    language: str | None = None
    """The language to read `text` in (a multilingual model picks its phonemiser by it);
    None: the voice's own."""


@dataclass(frozen=True)
class Voice:
    name: str
    language: str
    sample_rate: int
    speaker_id: int | None = None


@dataclass(frozen=True)
class TokenPiece:
    """One token of a tokenization, seen the two ways clients ask for."""

    id: int
    data: bytes
    """What the token adds to decoded text (llama-server's `piece`); a token may hold only
    part of a UTF-8 character."""
    spelling: str
    """The token as its vocabulary spells it (vLLM's `token_strs`): `Ġworld`, `▁world`, `<|im_end|>`."""


@dataclass
class RequestUsage:
    """One request's consumption so far (mutable: a stream's grows as it runs)."""

    input_tokens: int = 0
    output_tokens: int = 0
    audio_seconds_in: float = 0.0
    """Audio transcribed."""
    audio_seconds_out: float = 0.0
    """Audio synthesised."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: RequestUsage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.audio_seconds_in += other.audio_seconds_in
        self.audio_seconds_out += other.audio_seconds_out
