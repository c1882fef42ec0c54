"""One request inside the llama.cpp batch engine: a generation (`Job`) or a prompt to
score (`ScoringJob`). The engine thread owns every field after submission; the consumer
only reads the channel or the future, and leaving (cancel) is seen through them."""

from __future__ import annotations

import contextlib
import itertools
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.llama_cpp.model import GgufModel
from modelpool.backends.textgen import logprobs as logprobs_kit
from modelpool.backends.textgen.channel import Channel
from modelpool.backends.textgen.decoding import Utf8Stream, tokens_to_generate
from modelpool.backends.textgen.logprobs import PieceOf, best, log_softmax
from modelpool.backends.textgen.sequence import TextSequence
from modelpool.inference import GenerationChunk, SamplingParams, Speculation, TokenLogprob
from modelpool.logs import current_request_id

if TYPE_CHECKING:
    from modelpool.backends.llama_cpp.adapters import AdapterSpec, LoadedAdapter
    from modelpool.backends.llama_cpp.vision import ImagePrompt

_arrival = itertools.count()
PENALTY_WINDOW = 64
"""Tokens the repetition, presence and frequency penalties look back over (llama.cpp's default)."""


class _InEngine:
    """Where a sequence stands in the context."""

    def __init__(self, prompt: list[int], adapter: AdapterSpec | None) -> None:
        self.prompt = prompt
        self.adapter = adapter
        """The LoRA adapter this sequence runs with (None: the base model)."""
        self.lora: LoadedAdapter | None = None
        """That adapter, loaded (set at admission by the engine)."""
        self.order = next(_arrival)
        self.seq_id = -1
        self.position = 0
        """The position of the next token to evaluate."""
        self.evaluated = 0
        """Prompt tokens already in the KV cache."""
        self.history: list[int] = []
        """Every token in this sequence's KV cells (-1 where an image is)."""
        self.done = False
        self.request_id = current_request_id.get()
        """The request this sequence serves (made in its context), for the log and its errors."""


class GgufDetokenizer:
    """A GGUF model's pieces as text, a character split across tokens held back."""

    def __init__(self, model: GgufModel) -> None:
        self._piece = model.piece
        self._utf8 = Utf8Stream()

    def add(self, token: int) -> str:
        return self._utf8.feed(self._piece(token))

    def flush(self) -> str:
        return self._utf8.flush()


class Job(_InEngine, TextSequence):
    """A generation: the kit's sequence, placed in the context, with its sampler chain."""

    def __init__(
        self,
        prompt: list[int],
        *,
        model: GgufModel,
        sampling: SamplingParams,
        max_new: int,
        channel: Channel[GenerationChunk],
        constraint: TokenConstraint | None = None,
        images: ImagePrompt | None = None,
        seed: int = 0,
        adapter: AdapterSpec | None = None,
    ) -> None:
        _InEngine.__init__(self, prompt, adapter)
        TextSequence.__init__(self, sampling=sampling, max_new=max_new, output=channel, detok=GgufDetokenizer(model),
                              end_ids=model.eog_set, prompt_tokens=len(prompt), constraint=constraint)  # fmt: skip
        self.images = images
        """A prompt with images: evaluated by libmtmd at admission instead of `prompt`."""
        self.seed = seed
        self.next_token: int | None = None
        """Sampled, not yet in the KV cache: the next step evaluates it."""
        self.sampler: Any = None
        self.drafted: list[int] = []
        """The draft model's guesses for this step, evaluated after `next_token`."""
        self.speculating = False
        """Whether the engine has a draft model (the last chunk then reports its guesses)."""
        self.guessed = self.guesses_taken = 0
        self._model = model
        self._logprobs: npt.NDArray[np.float64] | None = None
        self.argmax_only = sampling.temperature <= 0 and not _penalised(sampling)
        """Its chain is llama.cpp's greedy sampler alone: the engine takes the first highest
        logit itself (the same pick) without the chain's copy of the whole vocabulary."""

    def start(self, llama: Any) -> None:
        """Admitted: a sampler chain of its own. A text prompt's first (empty) chunk says the
        request is running; a prompt with images sends it once its images fit."""
        self.sampler = make_sampler(llama, self.sampling, self._model.n_vocab, self.seed)
        if _penalised(self.sampling):
            # As llama-server does: the prompt's last tokens count for the penalties too.
            for token in self.prompt[-PENALTY_WINDOW:]:
                llama.llama_sampler_accept(self.sampler, token)
        if self.images is None:
            self.output.put(GenerationChunk(prompt_tokens=self.prompt_tokens))

    def speculation(self) -> Speculation | None:
        return Speculation(self.guessed, self.guesses_taken) if self.speculating else None

    def room(self, n_ctx: int) -> int:
        return tokens_to_generate(self.prompt_tokens, self.sampling.max_tokens, n_ctx, "messages")

    def remember_logprobs(self, logits: npt.NDArray[np.float32]) -> None:
        """The model's own distribution, before this request's rules and sampling settings."""
        if self.sampling.logprobs is not None:
            self._logprobs = log_softmax(logits)

    def logprob(self, token: int) -> TokenLogprob:
        assert self._logprobs is not None
        return token_logprob(self._model, token, self._model.piece(token), self._logprobs, self.sampling.logprobs or 0)

    def close(self, llama: Any) -> None:
        if self.sampler is not None:
            llama.llama_sampler_free(self.sampler)
            self.sampler = None


class ScoringJob(_InEngine):
    """Log-probabilities of every prompt token given the ones before it."""

    def __init__(self, prompt: list[int], *, top_n: int = 0, adapter: AdapterSpec | None = None) -> None:
        super().__init__(prompt, adapter)
        self.top_n = top_n
        self.future: Future[list[TokenLogprob]] = Future()
        self.scored: list[TokenLogprob] = []

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()

    def start(self, model: GgufModel) -> None:
        self.scored = [first_token(model, self.prompt[0])]

    def finish(self) -> None:
        self.done = True  # before the result: whoever has it never counts this job in flight
        with contextlib.suppress(InvalidStateError):  # the caller gave up (cancelled) meanwhile
            self.future.set_result(self.scored)

    def fail(self, error: BaseException) -> None:
        self.done = True
        with contextlib.suppress(InvalidStateError):
            self.future.set_exception(error)

    def close(self, llama: Any) -> None:
        return


def make_sampler(llama: Any, sampling: SamplingParams, n_vocab: int, seed: int) -> Any:
    """A llama.cpp sampler chain with this request's settings, in llama-cpp-python's order:
    penalties, then greedy, or top-k, top-p, min-p, temperature and a seeded draw."""
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())

    def add(sampler: Any) -> None:
        llama.llama_sampler_chain_add(chain, sampler)  # the chain owns it from here

    if _penalised(sampling):
        add(llama.llama_sampler_init_penalties(n_vocab, PENALTY_WINDOW, sampling.repetition_penalty,
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


def token_logprob(
    model: GgufModel, token: int, piece: bytes, logprobs: npt.NDArray[np.float64], top_n: int, *, greedy: bool = True
) -> TokenLogprob:
    top = best(logprobs, top_n)
    return logprobs_kit.entry(token, float(logprobs[token]), piece, top, _special(model), greedy=greedy)


def scored_token(model: GgufModel, token: int, logprobs: npt.NDArray[np.float64], top_n: int) -> TokenLogprob:
    """A prompt token's entry: its text shows control tokens (<|im_end|>), and whether it
    was the most likely token there."""
    greedy = int(np.argmax(logprobs)) == token
    return token_logprob(model, token, model.piece(token, special=True), logprobs, top_n, greedy=greedy)


def first_token(model: GgufModel, token: int) -> TokenLogprob:
    return logprobs_kit.entry(token, None, model.piece(token, special=True))


def _special(model: GgufModel) -> PieceOf:
    """Alternatives show control tokens (<|im_end|>), not ""."""
    return lambda token: model.piece(token, special=True)
