"""Continuous batching for a GGUF model in process: one llama.cpp context serves up to
`parallel` sequences at once.

The context has a unified KV cache of `n_ctx × parallel` cells, one sequence id per
request, so each request may fill its whole `n_ctx` and none ever waits for cells. One
thread owns the context and runs steps: each step is one `llama_decode` of a batch that
holds the next token of every decoding sequence plus, in the room left (`n_batch`),
prompt tokens of newcomers — several short prompts at once, or the next piece of a long
one, so running streams never stall for a whole long prompt. A new request joins at the
next step; a finished or cancelled one leaves at once and its KV cells are freed (kept
for a later request's shared prefix with `reuse_prompt_cache`). Each sequence has its
own sampler chain and seed, grammar, stop strings and logprobs; scoring requests
(`/loglikelihood`, echo) are sequences too, whose every prompt position yields logits.
"""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelpool.backends.llama_cpp.adapters import AdapterCache, AdapterSpec, LoadedAdapter
from modelpool.backends.llama_cpp.microbatch import SPLIT_KV_FROM, lone_sequences
from modelpool.backends.llama_cpp.model import GgufModel
from modelpool.backends.llama_cpp.sequence import Job, ScoringJob, scored_token
from modelpool.backends.llama_cpp.speculative import Draft, Drafter
from modelpool.backends.llama_knobs import DEFAULT_ATTENTION, AttentionSettings
from modelpool.backends.textgen.engine_loop import EngineLoop
from modelpool.backends.textgen.logprobs import log_softmax
from modelpool.backends.textgen.step_failure import sequence_failed
from modelpool.errors import GenerationFailed, InvalidRequest, ModelLoadFailed
from modelpool.inference import GenerationChunk

if TYPE_CHECKING:
    from modelpool.backends.llama_cpp.vision import ImageProjector


@dataclass
class _Row:
    """One token of a step's batch, before it is written."""

    token: int
    position: int
    seq_id: int
    job: Job | ScoringJob | None
    """None: a spare row (see `_spare_beside`), whose cells are removed after the step."""
    logits: bool
    output: bool
    """Whether the step reads a result here (a guess's logits are read by its sequence's first row)."""


class _Slot:
    """A sequence id of the context, and what its KV cells hold while no job uses it."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.job: Job | ScoringJob | None = None
        self.cached: list[int] = []
        self.cached_adapter: str | None = None
        """The adapter `cached` was computed under: its KV cells serve only a request with the same one."""


class LlamaEngine(EngineLoop[Job | ScoringJob]):
    engine_name = "a llama.cpp"

    def __init__(
        self,
        model: GgufModel,
        *,
        n_ctx: int,
        parallel: int,
        n_batch: int,
        n_ubatch: int,
        n_threads: int,
        reuse_prompt_cache: bool,
        batch_invariant: bool,
        model_id: str,
        attention: AttentionSettings = DEFAULT_ATTENTION,
        drafter: Drafter | None = None,
        max_adapters: int = 8,
    ) -> None:
        import llama_cpp

        super().__init__(f"llama-{model_id}")
        self._llama = llama_cpp
        self.model = model
        self.n_ctx = n_ctx
        self.parallel = parallel
        self._reuse = reuse_prompt_cache
        guesses = drafter.options.n_max if drafter is not None else 0
        self._n_batch = max(n_batch, parallel * (1 + guesses))  # every next token and its guesses fit
        self._n_ubatch = min(n_ubatch, self._n_batch)
        self._invariant = batch_invariant
        self._spares: list[_Row] = []
        capacity = self._n_batch + parallel  # and a spare row in every other sequence at most
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * parallel
        params.n_batch = capacity
        params.n_ubatch = self._n_ubatch
        params.n_seq_max = parallel
        # Batch-invariant: a KV stream per sequence, so its cells always sit in position order
        # (in one unified cache a newcomer's tokens fill the holes a finished sequence left,
        # and attention would sum a sequence's cells in another order than alone).
        params.kv_unified = not batch_invariant
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        attention.apply(params)
        context = llama_cpp.llama_init_from_model(model.model, params)
        if not context:
            raise ModelLoadFailed(f"model '{model_id}': llama.cpp could not make a context of {params.n_ctx} tokens "
                                  f"({attention.describe()})")  # fmt: skip
        self.context: Any = context
        self._memory = llama_cpp.llama_get_memory(context)
        self.adapters = AdapterCache(llama_cpp, model.model, context, max_adapters=max_adapters, model_id=model_id)
        self._batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        self._slots = [_Slot(i) for i in range(parallel)]
        self.projector: ImageProjector | None = None
        self.drafter = drafter
        self._count_from_zero()
        self._waiting: deque[Job | ScoringJob] = deque()
        """Taken in by the engine thread, waiting for a free sequence id (engine thread only)."""
        self.start_thread()

    def _count_from_zero(self) -> None:
        """What the engine did, for tests, the benchmark and the admin API."""
        self.decode_steps = 0
        self.largest_batch = 0
        """Most sequences one step has decoded together."""
        self.most_prompts_in_a_step = 0
        """Most prompts (or pieces of prompts) one step has prefilled together."""
        self.reused_tokens = 0
        """Prompt tokens taken from the KV cells of an earlier request (reuse_prompt_cache)."""
        self.drafted_tokens = self.accepted_tokens = 0
        """Guesses of the draft model checked, and those the model agreed with (all requests)."""

    # ----- from other threads --------------------------------------------------------

    def close(self) -> None:
        """Stop the engine thread (failing what still runs), then free the context."""
        self.stop_thread()
        if self.projector is not None:
            self.projector.close()
        self._llama.llama_batch_free(self._batch)
        self._llama.llama_free(self.context)
        if self.drafter is not None:
            self.drafter.close()
        self.model.close()

    @property
    def in_flight(self) -> int:
        """Requests submitted, waiting or running, not finished (a snapshot; a finished one
        counts no more once its end is published, before its slot is released)."""
        running = sum(1 for slot in self._slots if (job := slot.job) is not None and not job.done)
        return self.submitted + len(self._waiting) + running

    def load_adapter(self, spec: AdapterSpec) -> Future[LoadedAdapter]:
        """Load an adapter now (preload, admin), on the engine thread between two steps."""
        return self.call(lambda: self.adapters.acquire(spec, self._adapters_in_use))

    def unload_adapter(self, name: str) -> Future[bool]:
        """Unload an idle adapter (False: it was not loaded; Overloaded: a running request uses it)."""
        return self.call(lambda: self.adapters.unload(name, self._adapters_in_use))

    def cells_in_use(self) -> Future[int]:
        """KV cells that hold some sequence's tokens (asked on the engine thread)."""
        llama, memory = self._llama, self._memory

        def count() -> int:
            lows = (llama.llama_memory_seq_pos_min(memory, slot.seq_id) for slot in self._slots)
            highs = (llama.llama_memory_seq_pos_max(memory, slot.seq_id) for slot in self._slots)
            return sum(high - low + 1 for low, high in zip(lows, highs, strict=True) if high >= 0)

        return self.call(count)

    # ----- the engine thread ---------------------------------------------------------

    def intake(self, arrived: list[Job | ScoringJob]) -> None:
        self._waiting.extend(arrived)

    def taken_in(self) -> list[Job | ScoringJob]:
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting

    def busy(self) -> bool:
        return bool(self._waiting) or any(slot.job is not None for slot in self._slots)

    def step(self) -> None:
        self._drop_cancelled()
        self._admit()
        self._draft()
        rows = self._fill_batch()
        decoded = False
        for lora, group in _by_adapter(rows):  # one llama_decode per adapter: llama.cpp applies them per context
            decoded = self._decode(group, lora) or decoded
        self.decode_steps += decoded
        self._release_finished()

    def _decode(self, rows: list[_Row], lora: LoadedAdapter | None) -> bool:
        """One llama_decode of `rows` (all under one adapter), then each output row's result."""
        if self._invariant:
            self._no_lone_row(rows)
        outputs = self._write(rows)
        if self._batch.n_tokens == 0:  # (a prompt piece that does not end its prompt has no output, but is evaluated)
            return False
        self.adapters.apply(lora)
        status = self._llama.llama_decode(self.context, self._batch)
        for spare in self._spares:
            self._llama.llama_memory_seq_rm(self._memory, spare.seq_id, spare.position, -1)
        self._spares = []
        if status != 0:
            raise GenerationFailed(f"llama_decode returned {status}")
        for index, job, position in outputs:
            try:
                if isinstance(job, ScoringJob):
                    self._score(job, index, position)
                elif job.drafted:
                    self._verify(job, index)
                else:
                    self._sample(job, index)
            except Exception as exc:  # this row's own sampling, logprobs or stops: it fails alone
                job.fail(sequence_failed(job.request_id, exc, what="a llama.cpp sequence's step"))
        return True

    # ----- admission -----------------------------------------------------------------

    def _admit(self) -> None:
        while self._waiting:
            slot = self._free_slot(self._waiting[0])
            if slot is None or not self._adapter_fits(self._waiting[0]):
                return
            job = self._waiting.popleft()
            if job.cancelled:
                continue
            slot.job = job
            job.seq_id = slot.seq_id
            try:
                self._start(job, slot)
            except (InvalidRequest, GenerationFailed, ModelLoadFailed) as exc:  # this request's own problem
                job.fail(exc)
                self._free(slot, keep_cells=False)
            except Exception as exc:  # starting this sequence failed: the others go on
                job.fail(sequence_failed(job.request_id, exc, what="starting a llama.cpp sequence"))
                self._free(slot, keep_cells=False)

    def _free_slot(self, job: Job | ScoringJob) -> _Slot | None:
        free = [slot for slot in self._slots if slot.job is None]
        if not free:
            return None
        if not self._reuse or not isinstance(job, Job) or job.images is not None:
            return min(free, key=lambda slot: len(slot.cached))  # leave the richest caches for later
        # The longest reusable prefix; with none, the emptiest slot (another adapter's cache may serve later).
        return max(free, key=lambda slot: (self._reusable(slot, job), -len(slot.cached)))

    def _reusable(self, slot: _Slot, job: Job) -> int:
        """Prompt tokens whose KV cells `slot` holds for `job`: none computed under another adapter."""
        same_adapter = slot.cached_adapter == (job.adapter.name if job.adapter is not None else None)
        return _common_prefix(slot.cached, job.prompt) if same_adapter else 0

    def _adapter_fits(self, job: Job | ScoringJob) -> bool:
        """A sequence whose adapter cannot be loaded until a running one ends waits (in order)."""
        return job.adapter is None or self.adapters.can_take(job.adapter, self._adapters_in_use)

    def _adapters_in_use(self) -> list[str]:
        return [slot.job.lora.spec.name for slot in self._slots if slot.job is not None and slot.job.lora is not None]

    def _start(self, job: Job | ScoringJob, slot: _Slot) -> None:
        self._check_tokens(job)
        if job.adapter is not None:
            job.lora = self.adapters.acquire(job.adapter, self._adapters_in_use)
        keep = 0
        if self._reuse and isinstance(job, Job) and job.images is None:
            # At least the last prompt token is evaluated again: its logits choose the first token.
            keep = min(self._reusable(slot, job), len(job.prompt) - 1)
        self._llama.llama_memory_seq_rm(self._memory, slot.seq_id, keep, -1)
        slot.cached, slot.cached_adapter = [], None
        if self.drafter is not None:
            self.drafter.forget(slot.seq_id)
            if isinstance(job, Job):
                job.speculating = job.images is None
        job.position = job.evaluated = keep
        job.history = job.prompt[:keep]
        self.reused_tokens += keep
        if isinstance(job, ScoringJob):
            job.start(self.model)
        else:
            job.start(self._llama)
            if job.images is not None:
                self._prefill_images(job)

    def _check_tokens(self, job: Job | ScoringJob) -> None:
        """A token id outside the vocabulary would fail the whole batch's decode (llama.cpp
        refuses the batch): refused here, for this sequence alone. The backends check ids
        from requests before they get here; this keeps any other path from reaching decode."""
        n_vocab = self.model.n_vocab
        bad = next((t for t in job.prompt if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})", param="prompt")

    def _prefill_images(self, job: Job) -> None:
        """Evaluate a prompt with images at once (libmtmd decodes it itself, the images as
        their projected embeddings), then choose its first token from the last logits."""
        assert self.projector is not None and job.images is not None
        chunks = self.projector.tokenize(job.images)
        self.adapters.apply(job.lora)  # libmtmd decodes the prompt itself, under the context's adapters
        try:
            job.prompt_tokens = chunks.n_tokens
            job.max_new = job.room(self.n_ctx)  # a prompt or max_tokens too long fails here, before any work
            job.position = job.evaluated = self.projector.evaluate(chunks, self.context, job.seq_id, self._n_batch)
        finally:
            chunks.close()
        # The images' cells hold no token: -1 there, so that no later prompt can match them.
        job.history = [-1] * chunks.n_tokens
        job.output.put(GenerationChunk(prompt_tokens=job.prompt_tokens))
        if job.max_new == 0:
            job.finish("length", hit_stop=False)
        else:
            self._sample(job, -1)

    # ----- one step's batch ----------------------------------------------------------

    def _fill_batch(self) -> list[_Row]:
        """The next token of every decoding sequence (and its draft's guesses), then prompt
        pieces in admission order while there is room: the step's rows, not yet written."""
        rows: list[_Row] = []

        def add(token: int, job: Job | ScoringJob, logits: bool, output: bool) -> None:
            rows.append(_Row(token, job.position, job.seq_id, job, logits, output))
            job.position += 1
            job.history.append(token)

        active = [slot.job for slot in self._slots if slot.job is not None and not slot.job.done]
        decoding = 0
        for job in active:
            if isinstance(job, Job) and job.next_token is not None:
                add(job.next_token, job, True, True)
                job.next_token = None
                decoding += 1
                for guess in job.drafted:
                    add(guess, job, True, False)
        prompts = 0
        for job in sorted(active, key=lambda j: j.order):
            room = self._n_batch - len(rows)
            if room <= 0:
                break
            if job.evaluated >= len(job.prompt) or (isinstance(job, Job) and job.images is not None):
                continue
            piece = job.prompt[job.evaluated : job.evaluated + room]
            last = job.evaluated + len(piece) == len(job.prompt)
            for offset, token in enumerate(piece):
                # A scoring job wants every position's logits; a generation only its prompt's last.
                wanted = isinstance(job, ScoringJob) or (last and offset == len(piece) - 1)
                add(token, job, wanted, wanted)
            job.evaluated += len(piece)
            prompts += 1
        self.largest_batch = max(self.largest_batch, decoding)
        self.most_prompts_in_a_step = max(self.most_prompts_in_a_step, prompts)
        return rows

    def _write(self, rows: list[_Row]) -> list[tuple[int, Job | ScoringJob, int]]:
        """Rows into the batch; (batch index, job, position) for each output row (a drafted
        sequence's first row stands for all of its rows)."""
        batch, outputs = self._batch, []
        for index, row in enumerate(rows):
            batch.token[index], batch.pos[index], batch.n_seq_id[index] = row.token, row.position, 1
            batch.seq_id[index][0], batch.logits[index] = row.seq_id, row.logits
            if row.output and row.job is not None:
                outputs.append((index, row.job, row.position))
        batch.n_tokens = len(rows)
        return outputs

    def _no_lone_row(self, rows: list[_Row]) -> None:
        """No row past `SPLIT_KV_FROM` alone in a micro-batch (microbatch.py: llama.cpp would
        give it the split-KV attention kernel, which rounds differently). The rows are put in
        sequence-id order, which llama.cpp's equal split follows. A lone row that is the last
        of several of its sequence waits for the next step (a draft's guess is dropped and
        guessed again, a prompt piece ends a token earlier); a sequence's only row gets a
        spare row beside it, in the next or previous sequence id, which joins the two in a
        micro-batch. Each round removes a row or adds a spare, so this ends."""
        rows.sort(key=lambda row: row.seq_id)  # stable: each sequence's rows keep their order
        while (index := self._lone_row(rows)) is not None:
            row, job = rows[index], rows[index].job
            assert job is not None  # `_lone_row` skips spare rows
            if index > 0 and rows[index - 1].job is job:
                del rows[index]
                job.position -= 1
                job.history.pop()
                if isinstance(job, Job) and job.drafted and not row.output:
                    job.drafted.pop()
                else:  # a prompt row: the piece ends a token earlier
                    job.evaluated -= 1
            elif (spare := self._spare_beside(row.seq_id, rows)) is not None:
                rows.insert(index + (spare.seq_id > row.seq_id), spare)
                self._spares.append(spare)
            else:  # parallel = 1: nothing to borrow
                return

    def _lone_row(self, rows: list[_Row]) -> int | None:
        """The index of a request's row that would be alone in a micro-batch past `SPLIT_KV_FROM`."""
        groups: list[tuple[int, int]] = []
        for row in rows:
            if groups and groups[-1][0] == row.seq_id:
                groups[-1] = (row.seq_id, groups[-1][1] + 1)
            else:
                groups.append((row.seq_id, 1))
        for seq_id in lone_sequences(groups, self._n_ubatch):
            index = max(i for i, row in enumerate(rows) if row.seq_id == seq_id)
            if rows[index].job is not None and rows[index].position >= SPLIT_KV_FROM:
                return index
        return None

    def _spare_beside(self, seq_id: int, rows: list[_Row]) -> _Row | None:
        """A row of a sequence next to `seq_id` that has none in this step, after what its
        cells hold (a free sequence's cached prefix, or a waiting prompt's evaluated part):
        its cells are removed again after the step and its logits never read. Short
        sequences never need it, so a lone short chat pays nothing."""
        taken = {row.seq_id for row in rows}
        for neighbour in (seq_id + 1, seq_id - 1):
            if not 0 <= neighbour < self.parallel or neighbour in taken:
                continue
            slot = self._slots[neighbour]
            position = len(slot.cached) if slot.job is None else slot.job.position
            if position < self.n_ctx:
                return _Row(max(self.model.bos, 0), position, neighbour, None, False, False)
        return None

    # ----- after the step: one output row --------------------------------------------

    def _logits(self, index: int) -> np.ndarray:
        pointer = self._llama.llama_get_logits_ith(self.context, index)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.model.n_vocab,))

    def _sample(self, job: Job, index: int) -> None:
        token = self._choose(job, index, self._logits(index))
        if not job.accept(token):
            job.next_token = token

    def _verify(self, job: Job, index: int) -> None:
        """Rows index.. hold the sequence's next token then its draft's guesses: its sampler
        chain picks from each row in turn while the pick equals the guess that row's
        successor was computed with (speculative.py says why that is the model's own
        output). The cells after the last row used are removed, from the draft's cache too.\""""
        guesses, job.drafted = job.drafted, []
        start = job.position - len(guesses) - 1  # the next token's position
        job.guessed += len(guesses)  # counted before `accept`, whose last chunk reports them
        self.drafted_tokens += len(guesses)
        row = 0
        while True:
            token = self._choose(job, index + row, self._logits(index + row))
            agreed = row < len(guesses) and token == guesses[row]
            job.guesses_taken += agreed
            self.accepted_tokens += agreed
            if job.accept(token):
                break
            if not agreed:
                job.next_token = token
                break
            row += 1
        keep = start + row + 1
        self._llama.llama_memory_seq_rm(self._memory, job.seq_id, keep, -1)
        del job.history[keep:]
        job.position = keep
        if self.drafter is not None:
            self.drafter.keep(job.seq_id, keep)

    def _draft(self) -> None:
        """The draft's guesses for every decoding sequence that may speculate: a text
        sequence with room left (a prompt with images is not: the draft cannot see them)."""
        drafter = self.drafter
        if drafter is None:
            return
        wanted: list[tuple[Job, Draft]] = []
        for slot in self._slots:
            job = slot.job
            if not isinstance(job, Job) or job.done or job.next_token is None or job.images is not None:
                continue
            room = min(self.n_ctx, drafter.n_ctx) - 1 - job.position
            budget = min(drafter.options.n_max, job.max_new - job.generated - 1, room)
            if budget > 0:
                wanted.append((job, Draft(job.seq_id, [*job.history, job.next_token], budget)))
        guesses = drafter.propose([want for _, want in wanted])
        for job, want in wanted:
            job.drafted = guesses.get(want.seq_id, [])
            if not job.drafted:  # guesses it evaluated and then dropped (fewer than n_min) go too
                drafter.keep(job.seq_id, len(want.context))

    def _choose(self, job: Job, index: int, logits: np.ndarray) -> int:
        """The sequence's sampler chain picks from logits that its rules were applied to in
        place (the context's own buffer, which the sampler reads)."""
        job.remember_logprobs(logits)
        if job.constraint is not None:
            logits[~job.constraint.allowed()] = -np.inf
        elif not job.may_end():
            logits[self.model.eog_ids] = -np.inf
        if job.argmax_only:
            # llama_sampler_sample fills a fresh candidate array of the whole vocabulary (49,152
            # entries for SmolLM2) for every pick; greedy alone needs only the argmax.
            return int(np.argmax(logits))
        return int(self._llama.llama_sampler_sample(job.sampler, self.context, index))

    def _score(self, job: ScoringJob, index: int, position: int) -> None:
        if position + 1 < len(job.prompt):
            logprobs = log_softmax(self._logits(index))
            job.scored.append(scored_token(self.model, job.prompt[position + 1], logprobs, job.top_n))
        if len(job.scored) == len(job.prompt):
            job.finish()

    # ----- leaving -------------------------------------------------------------------

    def _release_finished(self) -> None:
        for slot in self._slots:
            if slot.job is not None and slot.job.done:
                self._free(slot)

    def _free(self, slot: _Slot, *, keep_cells: bool = True) -> None:
        """`keep_cells=False`: the job never started (refused, or failed in `_start`), so its
        history does not say what the sequence's cells hold (an earlier request's prefix may
        still be there): they are all removed. A free sequence's cells must be exactly
        `cached`, which the spare row and prefix reuse build on."""
        job, slot.job = slot.job, None
        if job is not None:
            job.close(self._llama)
        if keep_cells and self._reuse and job is not None and isinstance(job, Job):
            slot.cached = job.history  # what the KV cells of this sequence now hold
            slot.cached_adapter = job.adapter.name if job.adapter is not None else None
        else:
            self._llama.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
            slot.cached, slot.cached_adapter = [], None

    def _drop_cancelled(self) -> None:
        for slot in self._slots:
            if slot.job is not None and slot.job.cancelled:
                slot.job.done = True
                self._free(slot)

    def fail_all(self, error_for: Callable[[Job | ScoringJob], BaseException]) -> None:
        """Every running sequence fails (a failed step: each client told only its request
        id); those waiting for a sequence id stay and run later."""
        for slot in self._slots:
            if slot.job is not None:
                slot.job.fail(error_for(slot.job))
                slot.job.close(self._llama)
                slot.job = None
            slot.cached = []
        self._llama.llama_memory_clear(self._memory, True)
        if self.drafter is not None:
            for slot in self._slots:
                self.drafter.forget(slot.seq_id)


def _by_adapter(rows: list[_Row]) -> list[tuple[LoadedAdapter | None, list[_Row]]]:
    """The step's rows grouped by the adapter their sequence runs with, each group in row
    order (the base model's first); one group in the common case of no adapters."""
    groups: dict[int, tuple[LoadedAdapter | None, list[_Row]]] = {}
    for row in rows:
        lora = row.job.lora if row.job is not None else None
        groups.setdefault(id(lora) if lora is not None else 0, (lora, []))[1].append(row)
    return sorted(groups.values(), key=lambda group: group[0] is not None)


def _common_prefix(cached: list[int], prompt: list[int]) -> int:
    n = 0
    for a, b in zip(cached, prompt, strict=False):
        if a != b:
            break
        n += 1
    return n
