"""The blocking side of the llama.cpp backend. Everything here runs on the backend's
engine thread: a llama.cpp context is not free-threaded."""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.constraint import GrammarCompiler, TokenConstraint
from modelpool.backends.decoding import StopMatcher, Utf8Stream, may_end, tokens_to_generate
from modelpool.backends.llama_cpp.vision import ImageProjector
from modelpool.errors import InvalidRequest
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob, TopLogprob, Usage

if TYPE_CHECKING:
    from llama_cpp import Llama, LogitsProcessorList
    from llguidance import LLTokenizer


class LlamaEngine:
    def __init__(self, llm: Llama, *, reuse_prompt_cache: bool) -> None:
        import llama_cpp

        self.llm = llm
        self._vocab = llm._model.vocab
        self._is_eog = llama_cpp.llama_vocab_is_eog
        self._reuse_prompt_cache = reuse_prompt_cache

    @property
    def context_length(self) -> int:
        return int(self.llm.n_ctx())

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def check_token_ids(self, tokens: tuple[int, ...], param: str) -> list[int]:
        n_vocab = self.llm.n_vocab()
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})", param=param)
        return list(tokens)

    def token_text(self, tokens: list[int]) -> str:
        return self.llm.detokenize(tokens).decode("utf-8", errors="replace")

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built on the first constrained request (~0.2 s for a 49k vocabulary), then kept."""
        eog = [int(t) for t in self._eog_ids]
        eos = self.llm.token_eos()
        return GrammarCompiler(grammar_tokenizer(self.llm), self.llm.n_vocab(), eog, eos)

    def generate(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        cancel: threading.Event,
        *,
        param: str,
        constraint: TokenConstraint | None = None,
        prefilled: bool = False,
    ) -> Iterator[GenerationChunk]:
        """Stream the completion of `prompt`. The first chunk is empty and comes once the
        request is known to fit, so request errors are raised before anything streams.
        With a `constraint`, only tokens its grammar allows are sampled, and the
        generation ends when the grammar is complete."""
        prompt = self.start_of(prompt, param)
        max_new = self._check_fits(prompt, sampling.max_tokens, param)
        yield GenerationChunk()
        if max_new == 0:
            yield GenerationChunk(finish_reason="length", usage=Usage(len(prompt), 0))
            return
        llm = self.llm
        llm.set_seed(sampling.seed if sampling.seed is not None else random.getrandbits(31))
        if not self._reuse_prompt_cache and not prefilled:
            # A fresh evaluation of the whole prompt keeps seeded and greedy output
            # reproducible; reusing a cached prefix changes the arithmetic slightly.
            llm.reset()
        utf8, stops = Utf8Stream(), StopMatcher(sampling.stop)
        pending: list[TokenLogprob] = []
        generated, finish, hit_stop = 0, "length", False
        tokens = llm.generate(
            prompt,
            temp=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repeat_penalty=sampling.repetition_penalty,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            logits_processor=self._logits_processor(sampling, prompt, constraint),
        )
        for token in tokens:
            if cancel.is_set():
                return
            if self._is_eog(self._vocab, token):
                finish = "stop"
                break
            if constraint is not None:
                constraint.advance(token)
            generated += 1
            piece = llm.detokenize([token])
            if sampling.logprobs is not None:
                pending.append(self._logprob(token, piece, sampling.logprobs))
            text, hit_stop = stops.feed(utf8.feed(piece), armed=generated >= sampling.min_tokens)
            if text or hit_stop:
                yield GenerationChunk(text, tuple(pending))
                pending = []
            if hit_stop or (constraint is not None and constraint.complete):
                finish = "stop"
                break
            if generated >= max_new:
                break
        tail = ""
        if not hit_stop:  # release what was held back for a stop sequence that never came
            tail, hit_stop = stops.feed(utf8.flush())
            tail += "" if hit_stop else stops.flush()
        yield GenerationChunk(tail, tuple(pending), finish_reason=finish, usage=Usage(len(prompt), generated))

    def generate_with_images(
        self,
        projector: ImageProjector,
        text: str,
        images: Sequence[Any],
        sampling: SamplingParams,
        cancel: threading.Event,
        *,
        add_bos: bool,
        constraint: TokenConstraint | None = None,
    ) -> Iterator[GenerationChunk]:
        """As `generate`, for a prompt whose images the projector evaluates first (the
        prompt then counts their tokens)."""
        prompt = projector.prefill(self.llm, text, images, add_bos=add_bos)
        yield from self.generate(prompt, sampling, cancel, param="messages", constraint=constraint, prefilled=True)

    @cached_property
    def _eog_ids(self) -> npt.NDArray[np.intc]:
        """Every end-of-generation token (EOS, EOT, <|im_end|>, ...). Found on first use:
        one call per vocabulary entry (~15 ms for 49k), paid only by ignore_eos/min_tokens."""
        n_vocab = self.llm.n_vocab()
        return np.array([t for t in range(n_vocab) if self._is_eog(self._vocab, t)], dtype=np.intc)

    def _logits_processor(
        self, sampling: SamplingParams, prompt: list[int], constraint: TokenConstraint | None
    ) -> LogitsProcessorList | None:
        """Rules out tokens before llama.cpp samples: those the constraint's grammar does not
        allow, and end-of-generation tokens while the request may not end yet (ignore_eos,
        min_tokens). None keeps llama.cpp's own sampler chain untouched."""
        if constraint is None and may_end(sampling, 0):
            return None
        from llama_cpp import LogitsProcessorList

        eog, prompt_length = self._eog_ids, len(prompt)

        def restrict(input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
            if constraint is not None:
                logits[~constraint.allowed()] = -np.inf
            # input_ids is the prompt plus the tokens generated so far (llama.cpp's own count,
            # right also when a cached prefix was reused).
            # A grammar decides itself when the output may end.
            elif not may_end(sampling, len(input_ids) - prompt_length):
                logits[eog] = -np.inf
            return logits

        return LogitsProcessorList([restrict])

    def start_of(self, prompt: list[int], param: str) -> list[int]:
        """An empty prompt means "from the start": the BOS token, as OpenAI's API treats it."""
        if prompt:
            return prompt
        bos = self.llm.token_bos()
        if bos < 0:
            raise InvalidRequest("the prompt is empty and this model has no start-of-text token", param=param)
        return [bos]

    def score_tokens(self, tokens: list[int], top_n: int, param: str = "prompt") -> list[TokenLogprob]:
        """Log-probabilities of every token given the ones before it, computed from the
        logits of one fresh evaluation (llama-cpp-python's own echo logprobs are shifted by
        one token, and its `logits_all` would keep n_ctx × n_vocab floats)."""
        self._check_fits(tokens, 0, param)
        llm, n_vocab = self.llm, self.llm.n_vocab()
        llm.reset()
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        scored = [self._scored(tokens[0], None, None, 0)]
        for start in range(0, len(tokens), llm.n_batch):
            chunk = tokens[start : start + llm.n_batch]
            llm._batch.set_batch(chunk, n_past=start, logits_all=True)
            llm._ctx.decode(llm._batch)
            for offset in range(len(chunk)):
                position = start + offset
                if position + 1 < len(tokens):
                    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(offset), shape=(n_vocab,))
                    scored.append(self._scored(tokens[position + 1], _log_softmax(logits), logits, top_n))
        llm.reset()  # the KV cache now holds this prompt, not a generation's: nothing to reuse
        return scored

    def _scored(self, token: int, logprobs: np.ndarray | None, logits: np.ndarray | None, top_n: int) -> TokenLogprob:
        piece = self.llm.detokenize([token], special=True)
        if logprobs is None or logits is None:
            return TokenLogprob(_text(piece), None, tuple(piece), token_id=token)
        top: tuple[TopLogprob, ...] = ()
        if top_n:
            best = np.argpartition(-logprobs, top_n)[:top_n]
            top = tuple(self._top(int(t), float(logprobs[t])) for t in best[np.argsort(-logprobs[best])])
        greedy = int(np.argmax(logits)) == token
        return TokenLogprob(_text(piece), float(logprobs[token]), tuple(piece), top, greedy=greedy, token_id=token)

    def _check_fits(self, prompt: list[int], max_tokens: int | None, param: str) -> int:
        return tokens_to_generate(len(prompt), max_tokens, self.context_length, param)

    def _logprob(self, token: int, piece: bytes, top_n: int) -> TokenLogprob:
        """Log-probabilities under the model's own distribution (before sampling settings)."""
        llm = self.llm
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        logprobs = _log_softmax(logits)
        top: tuple[TopLogprob, ...] = ()
        if top_n:
            best = np.argpartition(-logprobs, top_n)[:top_n]
            best = best[np.argsort(-logprobs[best])]
            top = tuple(self._top(int(t), float(logprobs[t])) for t in best)
        return TokenLogprob(_text(piece), float(logprobs[token]), tuple(piece), top, token_id=token)

    def _top(self, token: int, logprob: float) -> TopLogprob:
        piece = self.llm.detokenize([token], special=True)  # show <|im_end|>, not ""
        return TopLogprob(_text(piece), logprob, tuple(piece))


def grammar_tokenizer(llm: Llama) -> LLTokenizer:
    """llguidance's view of the model's vocabulary. Its builder calls a llama.cpp function
    that llama-cpp-python marks deprecated, once per token: the warning is silenced here."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(llm._model.vocab, n_vocab=llm.n_vocab(), eos_token=llm.token_eos())


def _log_softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum())
    return result


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")
