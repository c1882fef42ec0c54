"""Continuous batching on one thread: a new request joins the running batch at the next
decode step, each sequence stops on its own, a cancelled one leaves at the next step.

The batch's KV cache is left-padded: every row has the same length L, a row's padding
is masked out, and each row carries its own next position. Waiting prompts are prefilled
together, in one left-padded forward (up to `prefill_chunk` tokens, padding included, and
`prefill_rows` prompts); a prefix the whole group shares (a system prompt) is run once and
copied into each row. The group's cache is then padded to L and its rows appended to the
batch. A prompt longer than `prefill_chunk` is prefilled alone, in chunks (one chunk
between two decode steps, so running streams never stall for a whole long prompt), and so
is a prompt with images, in one piece (its image tokens must meet their pixels).

The cache holds rows × the longest row token places (left-padded), and `max_batch_tokens`
bounds that, not only what joins: every row grows by one place a step, so a batch admitted
within the budget outgrows it (32 rows asking for 8,192 tokens each would hold 262,144
places: 12 GB of float32 KV for SmolLM2-135M). Before a decode step would pass the budget,
the latest joined rows step out (their KV dropped) and wait at the head of the queue; they
come back when there is room, prefilling their prompt and what they generated so far, and
go on choosing the same tokens (vLLM's preemption by recomputation). A row with images
never steps out (its image inputs are not run again), and neither does a lone row.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F

from modelpool.backends.textgen.engine_loop import UNLOADED, EngineLoop
from modelpool.backends.textgen.step_failure import sequence_failed
from modelpool.backends.transformers.adapters import AdapterSpec, PeftAdapters
from modelpool.backends.transformers.sampling import choose_token
from modelpool.backends.transformers.sequence import Sequence
from modelpool.errors import InvalidRequest, ModelUnloaded, Overloaded

if TYPE_CHECKING:  # transformers is imported on the engine thread, as a model loads (see `_new_cache`)
    from modelpool.backends.transformers.kv_cache import SpareCache

T = TypeVar("T")

WORTH_SHARING = 64
"""Prompt tokens a shared prefix must save (its length times the other rows) to be run
once in a forward of its own rather than in every row."""


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_batch_tokens: int
    prefill_chunk: int
    prefill_rows: int
    """Most waiting prompts prefilled together in one forward (1: each alone)."""


def cache_argument(model: Any) -> str:
    """The name `forward` takes the KV cache under: `cache` since transformers 5.24, which
    deprecates `past_key_values` (a FutureWarning on every call); older releases know only
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ContinuousBatcher(EngineLoop[Sequence]):
    engine_name = "a transformers"

    def __init__(self, model: Any, tokenizer: Any, eos_ids: set[int], limits: BatchLimits, name: str) -> None:
        super().__init__(f"batcher-{name}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.limits = limits
        self.device = next(model.parameters()).device
        self._cache_arg = cache_argument(model)
        self._eos_tensor = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.decode_steps = 0
        self.largest_batch = 0
        self.prefill_forwards = 0
        """Forward passes over prompts (a group, a shared prefix, a chunk of a long prompt)."""
        self.largest_prefill = 0
        """Most prompts whose last tokens went through one forward together."""
        self.largest_cache = 0
        """Most token places (rows × width) the batch's cache held after a decode step."""
        self.preemptions = 0
        """Rows that stepped out of the batch to keep its cache within `max_batch_tokens`."""
        self._prefilling: list[Sequence] = []
        self._active: list[Sequence] = []
        self._cache: SpareCache | None = None
        self._mask: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self.adapters: PeftAdapters | None = None
        """The model's LoRA adapters (PEFT), set before the first request when it declares any."""
        self._parked: list[tuple[Callable[[], None], Future[Any]]] = []
        """Adapter calls waiting for an adapter place, retried before each step, in order."""
        self.start_thread()

    # ----- from other threads --------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Sequences in the batch or waiting for their prefill (a snapshot)."""
        return sum(not s.done for s in self._active) + len(self._prefilling) + self.submitted

    def close(self) -> None:
        self.stop_thread()

    # ----- the engine thread ---------------------------------------------------------

    def thread_context(self) -> Any:
        return torch.inference_mode()

    def intake(self, arrived: list[Sequence]) -> None:
        self._prefilling.extend(arrived)

    def _adapter_ready(self, head: Sequence) -> bool:
        """The next prompt's adapter is loaded (now, if a place is free or idle). False: every
        place is held by running sequences, and it waits its turn (in order); a load that
        fails fails that request alone (it leaves the queue)."""
        if self.adapters is None or head.adapter is None:
            return True
        try:
            self.adapters.acquire(head.adapter, self.adapters_in_use)
        except Overloaded:
            return False
        except Exception as exc:
            self._prefilling.remove(head)
            head.fail(exc)
            return False
        return True

    def adapters_in_use(self) -> set[str]:
        """Adapters of the running sequences (and of a prompt part-way through its prefill)."""
        running = [*self._active, *(s for s in self._prefilling if s.prefilled)]
        return {s.adapter.name for s in running if s.adapter is not None and not s.done}

    def adapter_call(self, adapter: AdapterSpec | None, rows: int, work: Callable[[], T]) -> Future[T]:
        """From any thread: `work` under `adapter` on the engine thread (see `under_adapter`).
        While every adapter place is held by running sequences it waits, retried between
        steps, as a prompt for a new adapter does (a scoring or a beam search, not a 429)."""
        future: Future[T] = Future()

        def attempt() -> None:
            if self.adapters is not None and adapter is not None:
                try:
                    self.adapters.acquire(adapter, self.adapters_in_use)
                except Overloaded:
                    self._parked.append((attempt, future))
                    return
                except BaseException as exc:
                    future.set_exception(exc)
                    return
            try:
                future.set_result(self.under_adapter(adapter, rows, work))
            except BaseException as exc:
                future.set_exception(exc)

        self.call(attempt)
        return future

    def under_adapter(self, adapter: AdapterSpec | None, rows: int, work: Callable[[], T]) -> T:
        """On the engine thread: `work` (a forward outside the batch, `rows` wide: a prompt's
        scoring, a beam search) with every row under `adapter` (loaded first if need be)."""
        if self.adapters is None:
            return work()
        if adapter is not None:
            self.adapters.acquire(adapter, self.adapters_in_use)
        with self.adapters.rows([adapter.name if adapter is not None else None] * rows):
            return work()

    def _adapter_rows(self, seqs: list[Sequence]) -> Any:
        """Around one forward: each row runs with its sequence's adapter (PEFT's `adapter_names`)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.rows([s.adapter.name if s.adapter is not None else None for s in seqs])

    def busy(self) -> bool:
        return bool(self._active or self._prefilling or self._parked)

    def step(self) -> None:
        parked, self._parked = self._parked, []
        for attempt, _ in parked:
            attempt()
        self._drop_cancelled()
        self._drop_bad_prompts()
        self._prefill()
        self._decode()

    def _prefill(self) -> None:
        """Up to `prefill_chunk` prompt tokens between two decode steps: the waiting prompts
        together (so a burst of new requests gets first tokens quickly), or one piece of a
        long prompt."""
        budget = self.limits.prefill_chunk
        while budget > 0 and self._prefilling:
            head = self._prefilling[0]
            if not self._adapter_ready(head):
                if head in self._prefilling:
                    return  # it waits for an adapter place
                continue
            if head.vision is not None or head.prefilled or len(head.context) > self.limits.prefill_chunk:
                if not self._has_room([head]):
                    return
                budget -= self._prefill_alone(head, budget)
                continue
            group = self._group(budget)
            if not group:  # the next prompt waits for room in the batch, or for a fresh budget
                return
            try:
                budget -= self._prefill_together(group)
            except Exception as exc:
                if any(seq not in self._prefilling for seq in group):
                    raise  # it failed after joining the batch: the batch's state cannot be trusted
                self._fail_prompts(group, exc)  # its own forward: the running batch goes on

    def _group(self, budget: int) -> list[Sequence]:
        """The waiting prompts, in order, that one forward of at most `budget` tokens
        prefills whole, and that the batch has room for."""
        group: list[Sequence] = []
        for seq in self._prefilling[: self.limits.prefill_rows]:
            if seq.vision is not None or seq.prefilled or (group and seq.adapter != group[0].adapter):
                break  # (a shared prefix's KV is computed under the first row's adapter)
            candidate = [*group, seq]
            shared = _shared_prefix([s.context for s in candidate])
            if _prefill_cost(candidate, shared) > budget or not self._has_room(candidate):
                break
            group = candidate
        return group

    def _prefill_together(self, group: list[Sequence]) -> int:
        """Prefill whole prompts in one left-padded forward (after their shared prefix, run
        once), join them to the batch, choose each one's first token."""
        cache, shared = _new_cache(), _shared_prefix([s.context for s in group])
        if shared:
            prefix = torch.tensor([group[0].context[:shared]], device=self.device)
            positions = torch.arange(shared, device=self.device).unsqueeze(0)
            with self._adapter_rows(group[:1]):
                self._forward(prefix, cache, positions, torch.ones_like(prefix))
            cache.batch_repeat_interleave(len(group))
        rests = [s.context[shared:] for s in group]
        width = max(len(rest) for rest in rests)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rests], device=self.device)
        own = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rests], device=self.device)
        # Each row's tokens go on from the shared prefix; positions under padding are masked.
        positions = (own.cumsum(dim=1) - 1 + shared).clamp(min=0)
        mask = torch.cat([torch.ones(len(group), shared, dtype=torch.long, device=self.device), own], dim=1)
        with self._adapter_rows(group):
            logits = self._forward(ids, cache, positions, mask)
        self.largest_prefill = max(self.largest_prefill, len(group))
        del self._prefilling[: len(group)]
        self._join(group, cache, mask, torch.tensor([len(s.context) for s in group], device=self.device))
        self._accept_rows(group, logits)
        self._remove_done()
        return _prefill_cost(group, shared)

    def _forward(self, ids: torch.Tensor, cache: Any, positions: Any, mask: torch.Tensor, **extra: Any) -> Any:
        """A prefill forward: the last position's logits of each row."""
        self.prefill_forwards += 1
        return self._run_model(ids, cache, positions, mask, **extra)

    def _run_model(self, ids: torch.Tensor, cache: Any, positions: Any, mask: torch.Tensor, **extra: Any) -> Any:
        """The one place the batch runs the model (prefill and decode alike, so that a
        per-row argument such as adapter names is added here once): the last position's
        logits of each row, after `ids` went into `cache`."""
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: cache},
            **extra,
        )
        return out.logits[:, -1]

    def _prefill_alone(self, seq: Sequence, budget: int) -> int:
        try:
            return self._prefill_piece(seq, budget)
        except ValueError as exc:  # this prompt's own problem (image tokens that do not fit its pixels)
            self._prefilling.remove(seq)
            seq.fail(InvalidRequest(f"the model refused this prompt: {exc}", param="messages"))
            return 0
        except Exception as exc:
            if seq not in self._prefilling:
                raise  # it failed after joining the batch: the batch's state cannot be trusted
            self._fail_prompts([seq], exc)  # its own forward: the running batch goes on
            return 0

    def _prefill_piece(self, seq: Sequence, budget: int) -> int:
        start = seq.prefilled
        # Image tokens must meet their pixels in one forward pass: no chunks for those prompts.
        context = seq.context
        chunk = context[start:] if seq.vision is not None else context[start : start + budget]
        if seq.cache is None:
            seq.cache = _new_cache()
        # With images the model places the prompt's tokens itself (2-D or multimodal positions).
        positions = torch.arange(start, start + len(chunk), device=self.device).unsqueeze(0)
        with self._adapter_rows([seq]):
            logits = self._forward(
                torch.tensor([chunk], device=self.device),
                seq.cache,
                None if seq.vision is not None else positions,
                torch.ones(1, start + len(chunk), dtype=torch.long, device=self.device),
                **(seq.vision or {}),
            )
        if seq.vision is not None:
            seq.position_offset = self._rope_delta()
        seq.prefilled += len(chunk)
        if seq.prefilled == len(context):
            self._prefilling.pop(0)
            self.largest_prefill = max(self.largest_prefill, 1)
            length = len(context)
            mask = torch.ones(1, length, dtype=torch.long, device=self.device)
            self._join([seq], seq.cache, mask, torch.tensor([length + seq.position_offset], device=self.device))
            seq.cache = None
            self._accept(seq, logits[0])
            self._remove_done()
        return len(chunk)

    def _rope_delta(self) -> int:
        """What the last prefill's multimodal rotary positions fell short of its token count
        (Qwen2-VL keeps it as `rope_deltas`); 0 for models with plain positions."""
        # transformers keeps it on the inner model, and only for families with M-RoPE.
        deltas = getattr(getattr(self.model, "model", None), "rope_deltas", None)
        return int(deltas.flatten()[0]) if isinstance(deltas, torch.Tensor) and deltas.numel() else 0

    def _decode(self) -> None:
        self._keep_within_budget()
        if not self._active:
            return
        assert self._mask is not None and self._next_pos is not None
        rows = len(self._active)
        ids = torch.tensor([[s.tokens[-1]] for s in self._active], device=self.device)
        mask = torch.cat([self._mask, torch.ones(rows, 1, dtype=torch.long, device=self.device)], dim=1)
        with self._adapter_rows(self._active):
            logits_rows = self._run_model(ids, self._cache, self._next_pos.unsqueeze(1), mask)
        self._mask, self._next_pos = mask, self._next_pos + 1
        self.decode_steps += 1
        self.largest_batch = max(self.largest_batch, rows)
        self.largest_cache = max(self.largest_cache, rows * mask.shape[1])
        self._accept_rows(list(self._active), logits_rows)
        self._remove_done()

    def _has_room(self, newcomers: list[Sequence]) -> bool:
        """The batch takes `newcomers` if it stays within `max_batch_size` rows and, through
        the next decode step, within `max_batch_tokens` places of cache (rows × the widest)."""
        if not self._active and len(newcomers) == 1:  # alone, any prompt that fits the model runs
            return True
        rows = len(self._active) + len(newcomers)
        if rows > self.limits.max_batch_size:
            return False
        width = max([self._width(), *(len(s.context) for s in newcomers)])
        return rows * (width + 1) <= self.limits.max_batch_tokens

    def _width(self) -> int:
        return 0 if self._mask is None else int(self._mask.shape[1])

    def _keep_within_budget(self) -> None:
        """Before a decode step: while the grown cache would pass `max_batch_tokens`, the
        latest joined row (not a lone one, not one with images) steps out to the head of the
        queue, its KV dropped (see the module's docstring)."""
        while len(self._active) > 1 and len(self._active) * (self._width() + 1) > self.limits.max_batch_tokens:
            victim = next((i for i in reversed(range(len(self._active))) if self._active[i].vision is None), None)
            if victim is None:
                return
            seq = self._active[victim]
            self._keep_rows([i for i in range(len(self._active)) if i != victim])
            seq.preempt()
            self._prefilling.insert(0, seq)
            self.preemptions += 1

    # ----- batch bookkeeping ---------------------------------------------------------

    def _join(self, seqs: list[Sequence], cache: SpareCache, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        """Append freshly prefilled rows (their cache, mask and next positions) to the batch."""
        if self._cache is None or self._mask is None or self._next_pos is None:
            self._cache, self._mask, self._next_pos = cache, mask, next_pos
            self._active.extend(seqs)
            return
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        self._cache.stack_rows(cache, width)
        self._next_pos = torch.cat([self._next_pos, next_pos])
        self._active.extend(seqs)

    def _remove_done(self) -> None:
        keep = [i for i, s in enumerate(self._active) if not s.done]
        if len(keep) < len(self._active):
            self._keep_rows(keep)

    def _keep_rows(self, keep: list[int]) -> None:
        """Only these rows of the batch stay (in order); columns that are padding in every
        row that stays go too."""
        if not keep:
            self._active, self._cache, self._mask, self._next_pos = [], None, None, None
            return
        assert self._cache is not None and self._mask is not None and self._next_pos is not None
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        first = int(torch.nonzero(mask.sum(dim=0))[0])  # columns that are padding in every row go
        self._cache.keep_rows(index, first)
        self._mask = mask[:, first:]
        self._next_pos = self._next_pos.index_select(0, index)
        self._active = [self._active[i] for i in keep]

    def _drop_cancelled(self) -> None:
        self._prefilling = [s for s in self._prefilling if not s.cancelled]
        for seq in self._active:
            if seq.cancelled:
                seq.done = True
        self._remove_done()

    def _drop_bad_prompts(self) -> None:
        """A token id outside the vocabulary would fail the forward of every row with it:
        refused here, for its sequence alone (the backend checks request ids before this)."""
        vocabulary = self._vocabulary_size
        for seq in [s for s in self._prefilling if not s.prefilled]:
            bad = next((t for t in seq.prompt if not 0 <= t < vocabulary), None)
            if bad is not None:
                self._prefilling.remove(seq)
                seq.fail(InvalidRequest(f"token id {bad} is outside the vocabulary (0..{vocabulary - 1})",
                                        param="prompt"))  # fmt: skip

    @cached_property
    def _vocabulary_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    def _fail_prompts(self, seqs: list[Sequence], error: Exception) -> None:
        """Prompts whose own prefill failed (before they joined the batch) fail alone."""
        for seq in seqs:
            self._prefilling.remove(seq)
            seq.fail(sequence_failed(seq.request_id, error, what="a transformers prefill"))

    def fail_all(self, error_for: Callable[[Sequence], BaseException]) -> None:
        for seq in [*self._active, *self._prefilling]:
            if not seq.done:
                seq.fail(error_for(seq))
        self._active, self._prefilling = [], []
        self._cache, self._mask, self._next_pos = None, None, None
        parked, self._parked = self._parked, []
        for _, future in parked:
            future.set_exception(ModelUnloaded(UNLOADED))

    # ----- one token of one sequence -------------------------------------------------

    def _accept_rows(self, seqs: list[Sequence], logits_rows: torch.Tensor) -> None:
        """Each sequence's next token from its row of `logits_rows`. The rows that choose
        plainly greedily (see `_plain_greedy`) share one argmax over the whole batch and one
        `.tolist()`: per row, `choose_token`'s clone, argmax and `int()` cost ~4 small torch
        calls each, which at 32 rows were ~2% of a decode step. The argmax is the same."""
        plain = [_plain_greedy(seq) for seq in seqs]
        chosen: list[int | None] = [None] * len(seqs)
        if any(plain):
            argmax = torch.argmax(logits_rows, dim=-1).tolist()
            # A row that may not end yet (ignore_eos, min_tokens) keeps the argmax unless it
            # is an end id: banning those ids changes nothing else (the first maximum stays).
            chosen = [token if ok and (token not in self.eos_ids or seq.may_end()) else None
                      for token, ok, seq in zip(argmax, plain, seqs, strict=True)]  # fmt: skip
        for seq, logits, token in zip(seqs, logits_rows, chosen, strict=True):
            self._accept(seq, logits, token)

    def _accept(self, seq: Sequence, logits: torch.Tensor, chosen: int | None = None) -> None:
        """The sequence's next token (`chosen` for it already, or from its logits); an error
        in its own sampling, logprobs or stops fails it alone (it leaves the batch at the
        next removal)."""
        try:
            self._accept_token(seq, logits, chosen)
        except Exception as exc:
            seq.fail(sequence_failed(seq.request_id, exc, what="a transformers sequence's step"))

    def _accept_token(self, seq: Sequence, logits: torch.Tensor, chosen: int | None) -> None:
        if seq.cancelled:
            seq.done = True
            return
        token = self._choose(seq, logits) if chosen is None else chosen
        seq.logits = logits
        seq.accept(token)
        seq.logits = None

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> int:
        """One row's token by its own sampling, penalties, grammar and end-of-sequence ban."""
        seen, generated = self._penalty_ids(seq)
        allowed, banned = None, None
        if seq.constraint is not None:  # the grammar decides when the output may end
            allowed = torch.from_numpy(seq.constraint.allowed()).to(self.device)
        elif not seq.may_end():
            banned = self._eos_tensor
        return choose_token(logits, seq.sampling, seen, generated, seq.generator, banned=banned, allowed=allowed)

    _NO_IDS = torch.empty(0, dtype=torch.long)

    def _penalty_ids(self, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt + generated ids (repetition penalty) and the generated ids (presence
        and frequency penalties), built only for the penalties the sequence uses: a tensor
        of the whole prompt per row and step is wasted on the common request without any."""
        params, empty = seq.sampling, self._NO_IDS.to(self.device)
        seen = torch.tensor(seq.prompt + seq.tokens, device=self.device) if params.repetition_penalty != 1.0 else empty
        penalised = params.presence_penalty or params.frequency_penalty
        generated = torch.tensor(seq.tokens, dtype=torch.long, device=self.device) if penalised else empty
        return seen, generated


def _plain_greedy(seq: Sequence) -> bool:
    """Its token is the argmax of its raw logits, but for the end ids when it may not end
    yet: greedy, no penalty, no grammar (what `choose_token` would otherwise apply first)."""
    params = seq.sampling
    return (
        params.temperature == 0
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
        and seq.constraint is None
    )


def _new_cache() -> SpareCache:
    """An empty cache for a prefill (its rows join the batch's cache afterwards)."""
    from modelpool.backends.transformers.kv_cache import SpareCache

    return SpareCache()


def _shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens all `prompts` share, if running them once is worth a forward
    of their own; short of each prompt's last token, whose logits its own row gives."""
    first, shared = prompts[0], min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        shared = next((i for i in range(shared) if prompt[i] != first[i]), shared)
    return shared if shared * (len(prompts) - 1) >= WORTH_SHARING else 0


def _prefill_cost(group: list[Sequence], shared: int) -> int:
    """Tokens one group's prefill runs: the shared prefix once, then every row padded to the longest rest."""
    return shared + len(group) * max(len(s.context) - shared for s in group)


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    """A left-padded mask padded on the left to `width` columns (its cache is padded alike
    by `SpareCache.stack_rows`)."""
    extra = width - mask.shape[1]
    return F.pad(mask, (extra, 0)) if extra else mask
