"""One request inside the llama.cpp batch engine: a generation (`Job`) or a prompt to
score (`ScoringJob`). The engine thread owns every field after submission; the consumer
only reads the channel or the future, and leaving (cancel) is seen through them."""

from __future__ import annotations

import contextlib
import itertools
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.llama_cpp.model import GgufModel
from modelpool.backends.textgen.channel import Channel
from modelpool.backends.textgen.decoding import StopMatcher, Utf8Stream, may_end, tokens_to_generate
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob, TopLogprob, Usage
from modelpool.logs import current_request_id

if TYPE_CHECKING:
    from modelpool.backends.llama_cpp.vision import ImagePrompt

_arrival = itertools.count()
PENALTY_WINDOW = 64
"""Tokens the repetition, presence and frequency penalties look back over (llama.cpp's default)."""


@dataclass(eq=False)
class _InEngine:
    """Where a sequence stands in the context."""

    prompt: list[int]
    order: int = field(default_factory=lambda: next(_arrival), init=False)
    seq_id: int = field(default=-1, init=False)
    position: int = field(default=0, init=False)
    """The position of the next token to evaluate."""
    evaluated: int = field(default=0, init=False)
    """Prompt tokens already in the KV cache."""
    history: list[int] = field(default_factory=list, init=False)
    """Every token in this sequence's KV cells (-1 where an image is)."""
    done: bool = field(default=False, init=False)
    request_id: str = field(default_factory=current_request_id.get, init=False)
    """The request this sequence serves (made in its context), for the log and its errors."""


@dataclass(eq=False)
class Job(_InEngine):
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new: int = 0
    channel: Channel[GenerationChunk] | None = None
    constraint: TokenConstraint | None = None
    """The grammar this sequence's output must follow (its own: free and constrained
    sequences share the batch)."""
    images: ImagePrompt | None = None
    """A prompt with images: evaluated by libmtmd at admission instead of `prompt`."""
    seed: int = 0
    prompt_tokens: int = field(default=0, init=False)
    next_token: int | None = field(default=None, init=False)
    """Sampled, not yet in the KV cache: the next step evaluates it."""
    sampler: Any = field(default=None, init=False)
    generated: int = field(default=0, init=False)
    _reported: int = field(default=0, init=False)
    """Of `generated`, those a chunk has counted (`GenerationChunk.token_count`)."""
    _model: GgufModel | None = field(default=None, init=False)
    _logprobs: npt.NDArray[np.float64] | None = field(default=None, init=False)
    _pending: list[TokenLogprob] = field(default_factory=list, init=False)
    _utf8: Utf8Stream = field(default_factory=Utf8Stream, init=False)
    _stops: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self._stops = StopMatcher(self.sampling.stop)
        self.prompt_tokens = len(self.prompt)

    @property
    def abandoned(self) -> bool:
        return self._channel.cancelled.is_set()

    @property
    def _channel(self) -> Channel[GenerationChunk]:
        assert self.channel is not None
        return self.channel

    def channel_put(self, chunk: GenerationChunk) -> None:
        self._channel.put(chunk)

    def start(self, model: GgufModel, llama: Any) -> None:
        """Admitted: a sampler chain of its own. A text prompt's first (empty) chunk says the
        request is running; a prompt with images sends it once its images fit."""
        self._model = model
        self.sampler = make_sampler(llama, self.sampling, model.n_vocab, self.seed)
        if _penalised(self.sampling):
            # As llama-server does: the prompt's last tokens count for the penalties too.
            for token in self.prompt[-PENALTY_WINDOW:]:
                llama.llama_sampler_accept(self.sampler, token)
        if self.images is None:
            self._channel.put(GenerationChunk(prompt_tokens=self.prompt_tokens))

    def room(self, n_ctx: int) -> int:
        return tokens_to_generate(self.prompt_tokens, self.sampling.max_tokens, n_ctx, "messages")

    def may_end(self) -> bool:
        return may_end(self.sampling, self.generated)

    def remember_logprobs(self, logits: npt.NDArray[np.float32]) -> None:
        """The model's own distribution, before this request's rules and sampling settings."""
        if self.sampling.logprobs is not None:
            self._logprobs = log_softmax(logits)

    def accept(self, token: int) -> None:
        model = self._model
        assert model is not None
        if token in model.eog_set:
            self.finish("stop", hit_stop=False)
            return
        if self.constraint is not None:
            self.constraint.advance(token)
        self.generated += 1
        piece = model.piece(token)
        if self.sampling.logprobs is not None and self._logprobs is not None:
            self._pending.append(token_logprob(model, token, piece, self._logprobs, self.sampling.logprobs))
        text, hit_stop = self._stops.feed(self._utf8.feed(piece), armed=self.generated >= self.sampling.min_tokens)
        if text or hit_stop:
            self._channel.put(GenerationChunk(text, tuple(self._pending), token_count=self._unreported()))
            self._pending = []
        if hit_stop or (self.constraint is not None and self.constraint.complete):
            self.finish("stop", hit_stop=hit_stop)
        elif self.generated >= self.max_new:
            self.finish("length", hit_stop=False)
        else:
            self.next_token = token

    def finish(self, reason: str, *, hit_stop: bool) -> None:
        tail = ""
        if not hit_stop:  # release what was held back for a stop sequence that never came
            tail, hit_stop = self._stops.feed(self._utf8.flush())
            tail += "" if hit_stop else self._stops.flush()
        usage = Usage(self.prompt_tokens, self.generated)
        stop = self._stops.matched
        self._channel.put(GenerationChunk(tail, tuple(self._pending), reason, usage, stop_sequence=stop,
                                          token_count=self._unreported()))  # fmt: skip
        self._channel.end()
        self.done = True

    def _unreported(self) -> int:
        """The generated tokens no chunk has counted yet (the next chunk counts them)."""
        count, self._reported = self.generated - self._reported, self.generated
        return count

    def fail(self, error: Exception) -> None:
        if not self.done:
            self._channel.end(error)
        self.done = True

    def close(self, llama: Any) -> None:
        if self.sampler is not None:
            llama.llama_sampler_free(self.sampler)
            self.sampler = None


@dataclass(eq=False)
class ScoringJob(_InEngine):
    """Log-probabilities of every prompt token given the ones before it."""

    top_n: int = 0
    future: Future[list[TokenLogprob]] = field(default_factory=Future)
    scored: list[TokenLogprob] = field(default_factory=list)

    @property
    def abandoned(self) -> bool:
        return self.future.cancelled()

    def start(self, model: GgufModel, llama: Any) -> None:
        self.scored = [first_token(model, self.prompt[0])]

    def finish(self) -> None:
        with contextlib.suppress(InvalidStateError):  # the caller gave up (cancelled) meanwhile
            self.future.set_result(self.scored)
        self.done = True

    def fail(self, error: Exception) -> None:
        with contextlib.suppress(InvalidStateError):
            self.future.set_exception(error)
        self.done = True

    def close(self, llama: Any) -> None:
        return


def make_sampler(llama: Any, sampling: SamplingParams, n_vocab: int, seed: int) -> Any:
    """A llama.cpp sampler chain with this request's settings, in llama-cpp-python's order:
    penalties, then greedy, or top-k, top-p, min-p, temperature and a seeded draw."""
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())

    def add(sampler: Any) -> None:
        llama.llama_sampler_chain_add(chain, sampler)  # the chain owns it from here

    if _penalised(sampling):
        add(llama.llama_sampler_init_penalties(PENALTY_WINDOW, sampling.repetition_penalty,
                                               sampling.frequency_penalty, sampling.presence_penalty))  # fmt: skip
    if sampling.temperature <= 0:
        add(llama.llama_sampler_init_greedy())
        return chain
    if sampling.top_k > 0:
        add(llama.llama_sampler_init_top_k(sampling.top_k))
    if sampling.top_p < 1.0:
        add(llama.llama_sampler_init_top_p(sampling.top_p, 1))
    if sampling.min_p > 0.0:
        add(llama.llama_sampler_init_min_p(sampling.min_p, 1))
    add(llama.llama_sampler_init_temp(sampling.temperature))
    add(llama.llama_sampler_init_dist(seed))
    return chain


def _penalised(sampling: SamplingParams) -> bool:
    return sampling.repetition_penalty != 1.0 or sampling.presence_penalty != 0.0 or sampling.frequency_penalty != 0.0


def log_softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum())
    return result


def token_logprob(
    model: GgufModel, token: int, piece: bytes, logprobs: npt.NDArray[np.float64], top_n: int, *, greedy: bool = True
) -> TokenLogprob:
    top: tuple[TopLogprob, ...] = ()
    if top_n:
        best = np.argpartition(-logprobs, top_n)[:top_n]
        best = best[np.argsort(-logprobs[best])]
        top = tuple(_top(model, int(t), float(logprobs[t])) for t in best)
    return TokenLogprob(_text(piece), float(logprobs[token]), tuple(piece), top, greedy=greedy, token_id=token)


def scored_token(model: GgufModel, token: int, logprobs: npt.NDArray[np.float64], top_n: int) -> TokenLogprob:
    """A prompt token's entry: its text shows control tokens (<|im_end|>), and whether it
    was the most likely token there."""
    greedy = int(np.argmax(logprobs)) == token
    return token_logprob(model, token, model.piece(token, special=True), logprobs, top_n, greedy=greedy)


def first_token(model: GgufModel, token: int) -> TokenLogprob:
    piece = model.piece(token, special=True)
    return TokenLogprob(_text(piece), None, tuple(piece), token_id=token)


def _top(model: GgufModel, token: int, logprob: float) -> TopLogprob:
    piece = model.piece(token, special=True)  # show <|im_end|>, not ""
    return TopLogprob(_text(piece), logprob, tuple(piece))


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")
