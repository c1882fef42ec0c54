"""Speculative decoding in the llama.cpp engine: a small draft model guesses a sequence's
next tokens, the target checks all of them in the one batched `llama_decode` it runs anyway.

The draft has a context of its own with a sequence per slot of the target's, holding the
same tokens as far as the target has accepted them. Each step, `Drafter.propose` brings
every drafting sequence's draft cells up to the target's (the tokens the target accepted
since, and its next token), then decodes one guessed token per round for all of them
together: the draft's most likely token, while its probability is at least `p_min` and up
to `n_max` tokens. The engine then verifies (engine.py, `_verify`).

Why the output is the target's own (greedy and sampled): the target evaluates the next
token and the guesses d1..dk in one batch, logits at each. Position j's logits are the
target's given the sequence so far plus d1..dj — exactly what it would compute one token
at a time once d1..dj had been chosen. The sequence's own sampler chain picks a token
from position 0's logits, then from position 1's only if that pick equalled d1, and so
on: every token emitted is drawn from the target's distribution given exactly the tokens
before it, with the chain's state (penalties, grammar, random generator) advanced once
per emitted token, as without a draft. So greedy output is the argmax chain, and a seeded
request draws the same numbers in the same order: the same text. A wrong guess costs only
the rows computed after it (their KV cells are removed). This is plain "sample and
compare", not the rejection-sampling scheme: fewer sampled guesses are accepted, but
nothing about the distribution has to be argued beyond the above.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.llama_cpp.model import GgufModel
from modelpool.errors import GenerationFailed, ModelLoadFailed


class SpeculativeOptions(BaseModel):
    """A draft model for speculative decoding (the `speculative` option of `llama_cpp`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    draft: str = Field(min_length=1, max_length=4096)
    """The draft GGUF, resolved like the model's `source` (a path, `package:` or `hf:`). Its
    vocabulary must be the target's (same tokens, same special tokens)."""
    n_max: int = Field(default=16, ge=1, le=32)
    """Most tokens drafted per step for one sequence."""
    n_min: int = Field(default=0, ge=0, le=32)
    """A draft shorter than this is not checked (that step decodes one token)."""
    p_min: float = Field(default=0.75, ge=0.0, le=1.0)
    """Drafting stops when the draft's most likely token has a lower probability."""
    n_gpu_layers: int = Field(default=0, ge=-1, le=1024)
    """Draft layers offloaded to the GPU (-1: all)."""
    n_ctx: int | None = Field(default=None, ge=16, le=1 << 20)
    """Draft context per sequence (default: the model's `n_ctx`). Past it a sequence
    decodes without drafting."""


@dataclass
class Draft:
    """What one sequence wants drafted this step."""

    seq_id: int
    context: list[int]
    """Every token of the sequence, the target's next (not yet evaluated) token last."""
    budget: int
    """Most tokens to draft (its n_max, cut to what max_tokens and n_ctx leave)."""


def check_vocabulary(target: GgufModel, draft: GgufModel, *, model_id: str, draft_path: str) -> None:
    """The draft must speak the target's vocabulary token for token: otherwise its guesses
    are other tokens and speculation is useless or wrong. ModelLoadFailed names both."""

    def refuse(why: str) -> ModelLoadFailed:
        return ModelLoadFailed(f"model '{model_id}': the draft {draft_path} does not share its vocabulary ({why})")

    if draft.n_vocab != target.n_vocab:
        raise refuse(f"{draft.n_vocab} tokens, the model has {target.n_vocab}")
    for name in ("bos", "eos"):
        if getattr(draft, name) != getattr(target, name):
            raise refuse(f"{name} token {getattr(draft, name)}, the model's is {getattr(target, name)}")
    if draft.eog_set != target.eog_set:
        raise refuse("different end-of-generation tokens")
    for token in range(target.n_vocab):
        if draft.spelling(token) != target.spelling(token):
            raise refuse(f"token {token} is {draft.spelling(token)!r}, the model's is {target.spelling(token)!r}")


class Drafter:
    """The draft model's context: one sequence per slot of the target's, owned by the engine
    thread. `held[seq]` is what the draft's KV cells of that sequence hold."""

    def __init__(self, model: GgufModel, *, n_ctx: int, parallel: int, n_threads: int, options: SpeculativeOptions,
                 model_id: str) -> None:  # fmt: skip
        import llama_cpp

        self._llama = llama_cpp
        self.model = model
        self.options = options
        self.n_ctx = n_ctx
        self._n_batch = max(512, parallel * 2)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * parallel
        params.n_batch = params.n_ubatch = self._n_batch
        params.n_seq_max = parallel
        params.kv_unified = True  # the draft's rounding never matters: the target checks every guess
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        context = llama_cpp.llama_init_from_model(model.model, params)
        if not context:
            raise ModelLoadFailed(
                f"model '{model_id}': llama.cpp could not make a draft context of {params.n_ctx} tokens"
            )
        self.context: Any = context
        self._memory = llama_cpp.llama_get_memory(context)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self.held: list[list[int]] = [[] for _ in range(parallel)]

    def close(self) -> None:
        self._llama.llama_batch_free(self._batch)
        self._llama.llama_free(self.context)
        self.model.close()

    def forget(self, seq_id: int) -> None:
        """A new request takes this sequence: the draft starts it afresh."""
        self._llama.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        self.held[seq_id] = []

    def keep(self, seq_id: int, count: int) -> None:
        """The target kept its first `count` tokens: the draft drops what it holds beyond."""
        if len(self.held[seq_id]) > count:
            self._llama.llama_memory_seq_rm(self._memory, seq_id, count, -1)
            del self.held[seq_id][count:]

    def propose(self, wanted: list[Draft]) -> dict[int, list[int]]:
        """Guessed tokens per sequence id. A sequence whose draft cells are too far behind
        (a long prompt) catches up by a batch's worth a step and drafts once it is level."""
        rows: list[tuple[Draft, int]] = []  # (sequence, its logits row) for the first round
        count = 0
        for want in wanted:
            held = self.held[want.seq_id]
            missing = want.context[len(held) :]
            piece = missing[: self._n_batch - count]
            for offset, token in enumerate(piece):
                self._add(count + offset, token, len(held) + offset, want.seq_id, offset == len(missing) - 1)
            held.extend(piece)
            count += len(piece)
            if len(piece) == len(missing) and missing:
                rows.append((want, count - 1))
        if count == 0:
            return {}
        self._decode(count)
        drafts: dict[int, list[int]] = {want.seq_id: [] for want, _ in rows}
        live = [(want, row) for want, row in rows if self._guess(row, drafts[want.seq_id], want.budget)]
        while live:
            for index, (want, _) in enumerate(live):
                guessed = drafts[want.seq_id][-1]
                self._add(index, guessed, len(self.held[want.seq_id]), want.seq_id, True)
                self.held[want.seq_id].append(guessed)
            self._decode(len(live))
            live = [(want, i) for i, (want, _) in enumerate(live) if self._guess(i, drafts[want.seq_id], want.budget)]
        return {seq: tokens for seq, tokens in drafts.items() if tokens and len(tokens) >= self.options.n_min}

    def _guess(self, row: int, tokens: list[int], budget: int) -> bool:
        """The draft's next guess from `row`'s logits, appended if confident enough; True while
        the sequence should draft another (its guess then goes into the next round)."""
        if len(tokens) >= budget:
            return False
        pointer = self._llama.llama_get_logits_ith(self.context, row)
        floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
        logits = np.ctypeslib.as_array(floats, shape=(self.model.n_vocab,))
        best = int(np.argmax(logits))
        top = float(logits[best])
        probability = 1.0 / float(np.sum(np.exp(logits - top)))
        if probability < self.options.p_min:
            return False
        tokens.append(best)
        return len(tokens) < budget

    def _add(self, index: int, token: int, position: int, seq_id: int, logits: bool) -> None:
        batch = self._batch
        batch.token[index], batch.pos[index], batch.n_seq_id[index] = token, position, 1
        batch.seq_id[index][0], batch.logits[index] = seq_id, logits

    def _decode(self, count: int) -> None:
        self._batch.n_tokens = count
        status = self._llama.llama_decode(self.context, self._batch)
        if status != 0:
            raise GenerationFailed(f"the draft's llama_decode returned {status}")
