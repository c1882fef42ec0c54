"""Continuous batching on one thread: a new request joins the running batch at the next
decode step, each sequence stops on its own, a cancelled one leaves at the next step.

The batch's KV cache is left-padded: every row has the same length L, a row's padding
is masked out, and each row carries its own next position. A prompt is prefilled alone,
in chunks (one chunk between two decode steps, so running streams never stall for a whole
long prompt), then its cache is padded to L and appended as a new row.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.decoding import StopMatcher, may_end
from modelpool.backends.transformers.detokenize import IncrementalDetokenizer
from modelpool.backends.transformers.sampling import choose_token
from modelpool.errors import GenerationFailed, InvalidRequest, ModelUnloaded
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob, TopLogprob, Usage

log = logging.getLogger("modelpool.backends")
END = None  # delivered after a sequence's last chunk


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    max_new: int
    deliver: Callable[[object], None]
    """Called on the engine thread with each GenerationChunk, then END (or an exception)."""
    generator: torch.Generator
    detok: IncrementalDetokenizer
    constraint: TokenConstraint | None = None
    """The grammar this sequence's output must follow (its own, so free and constrained
    sequences share the batch)."""
    vision: dict[str, Any] | None = None
    """A vision model's image inputs (pixel_values, ...) for the prompt: it is prefilled in
    one piece with them, then decodes in the batch like any other sequence."""
    position_offset: int = 0
    """Added to the positions of this sequence's generated tokens. Qwen2-VL gives an image
    fewer rotary positions than tokens (M-RoPE); the model reports the difference when it
    prefills the prompt, and decoding must go on from there."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0
    cache: Any = None
    done: bool = False
    stops: StopMatcher = field(init=False)
    pending: list[TokenLogprob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stops = StopMatcher(self.params.stop)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_batch_tokens: int
    prefill_chunk: int


class ContinuousBatcher:
    def __init__(self, model: Any, tokenizer: Any, eos_ids: set[int], limits: BatchLimits, name: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.limits = limits
        self.device = next(model.parameters()).device
        self._eos_tensor = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.decode_steps = 0
        self.largest_batch = 0
        self._cond = threading.Condition()
        self._incoming: deque[Sequence] = deque()
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._stopping = False
        self._prefilling: list[Sequence] = []
        self._active: list[Sequence] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    # ----- from other threads --------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Sequences in the batch or waiting for their prefill (a snapshot)."""
        return len(self._active) + len(self._prefilling) + len(self._incoming)

    def submit(self, sequence: Sequence) -> None:
        with self._cond:
            self._incoming.append(sequence)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread between two steps (scoring, warmup)."""
        future: Future[Any] = Future()
        with self._cond:
            self._jobs.append((fn, future))
            self._cond.notify()
        return future

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    # ----- the engine thread ---------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._stopping or self._incoming or self._jobs or self._active or self._prefilling):
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._prefilling.extend(self._incoming)
                    self._incoming.clear()
                    jobs = list(self._jobs)
                    self._jobs.clear()
                for fn, future in jobs:
                    _run_job(fn, future)
                self._step()
        self._fail_all(ModelUnloaded("the model was unloaded while this request ran"))
        for _, future in self._jobs:
            future.set_exception(ModelUnloaded("the model was unloaded"))

    def _step(self) -> None:
        try:
            self._drop_cancelled()
            self._prefill()
            self._decode()
        except Exception as exc:
            log.exception("generation step failed")
            self._fail_all(GenerationFailed(f"generation failed: {exc}"))

    def _prefill(self) -> None:
        """Up to `prefill_chunk` prompt tokens between two decode steps: several short prompts
        (so a crowd of new requests gets first tokens quickly), or one piece of a long one."""
        budget = self.limits.prefill_chunk
        while budget > 0 and self._prefilling and self._has_room(self._prefilling[0]):
            seq = self._prefilling[0]
            try:
                budget -= self._prefill_piece(seq, budget)
            except ValueError as exc:  # this prompt's own problem (image tokens that do not fit its pixels)
                self._prefilling.remove(seq)
                seq.done = True
                seq.deliver(InvalidRequest(f"the model refused this prompt: {exc}", param="messages"))

    def _prefill_piece(self, seq: Sequence, budget: int) -> int:
        start = seq.prefilled
        # Image tokens must meet their pixels in one forward pass: no chunks for those prompts.
        chunk = seq.prompt[start:] if seq.vision is not None else seq.prompt[start : start + budget]
        if seq.cache is None:
            from transformers import DynamicCache

            seq.cache = DynamicCache()
        # With images the model places the prompt's tokens itself (2-D or multimodal positions).
        positions = torch.arange(start, start + len(chunk), device=self.device).unsqueeze(0)
        out = self.model(
            input_ids=torch.tensor([chunk], device=self.device),
            position_ids=None if seq.vision is not None else positions,
            attention_mask=torch.ones(1, start + len(chunk), dtype=torch.long, device=self.device),
            past_key_values=seq.cache,
            use_cache=True,
            logits_to_keep=1,
            **(seq.vision or {}),
        )
        if seq.vision is not None:
            seq.position_offset = self._rope_delta()
        seq.prefilled += len(chunk)
        if seq.prefilled == len(seq.prompt):
            self._prefilling.pop(0)
            self._join(seq)
            self._accept(seq, out.logits[0, -1])
            self._remove_done()
        return len(chunk)

    def _rope_delta(self) -> int:
        """What the last prefill's multimodal rotary positions fell short of its token count
        (Qwen2-VL keeps it as `rope_deltas`); 0 for models with plain positions."""
        # transformers keeps it on the inner model, and only for families with M-RoPE.
        deltas = getattr(getattr(self.model, "model", None), "rope_deltas", None)
        return int(deltas.flatten()[0]) if isinstance(deltas, torch.Tensor) and deltas.numel() else 0

    def _decode(self) -> None:
        if not self._active:
            return
        assert self._mask is not None and self._next_pos is not None
        rows = len(self._active)
        ids = torch.tensor([[s.generated[-1]] for s in self._active], device=self.device)
        mask = torch.cat([self._mask, torch.ones(rows, 1, dtype=torch.long, device=self.device)], dim=1)
        out = self.model(
            input_ids=ids,
            position_ids=self._next_pos.unsqueeze(1),
            attention_mask=mask,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._mask, self._next_pos = mask, self._next_pos + 1
        self.decode_steps += 1
        self.largest_batch = max(self.largest_batch, rows)
        for seq, logits in zip(list(self._active), out.logits[:, -1], strict=True):
            self._accept(seq, logits)
        self._remove_done()

    def _has_room(self, seq: Sequence) -> bool:
        if not self._active:
            return True
        if len(self._active) >= self.limits.max_batch_size:
            return False
        return sum(s.length for s in self._active) + len(seq.prompt) <= self.limits.max_batch_tokens

    # ----- batch bookkeeping ---------------------------------------------------------

    def _join(self, seq: Sequence) -> None:
        length = len(seq.prompt)
        position = torch.tensor([length + seq.position_offset], device=self.device)
        if self._cache is None or self._mask is None or self._next_pos is None:
            self._cache, seq.cache = seq.cache, None
            self._mask = torch.ones(1, length, dtype=torch.long, device=self.device)
            self._next_pos = position
            self._active.append(seq)
            return
        width = self._mask.shape[1]
        if length > width:  # the newcomer is longer: pad the batch on the left
            for layer in self._cache.layers:
                layer.keys = F.pad(layer.keys, (0, 0, length - width, 0))
                layer.values = F.pad(layer.values, (0, 0, length - width, 0))
            self._mask = F.pad(self._mask, (length - width, 0))
            width = length
        for layer, own in zip(self._cache.layers, seq.cache.layers, strict=True):
            layer.keys = torch.cat([layer.keys, F.pad(own.keys, (0, 0, width - length, 0))], dim=0)
            layer.values = torch.cat([layer.values, F.pad(own.values, (0, 0, width - length, 0))], dim=0)
        row = F.pad(torch.ones(1, length, dtype=torch.long, device=self.device), (width - length, 0))
        self._mask = torch.cat([self._mask, row], dim=0)
        self._next_pos = torch.cat([self._next_pos, position])
        seq.cache = None
        self._active.append(seq)

    def _remove_done(self) -> None:
        keep = [i for i, s in enumerate(self._active) if not s.done]
        if len(keep) == len(self._active):
            return
        if not keep:
            self._active, self._cache, self._mask, self._next_pos = [], None, None, None
            return
        assert self._mask is not None and self._next_pos is not None
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        first = int(torch.nonzero(mask.sum(dim=0))[0])  # columns that are padding in every row go
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        self._mask = mask[:, first:]
        self._next_pos = self._next_pos.index_select(0, index)
        self._active = [self._active[i] for i in keep]

    def _drop_cancelled(self) -> None:
        self._prefilling = [s for s in self._prefilling if not s.cancelled.is_set()]
        for seq in self._active:
            if seq.cancelled.is_set():
                seq.done = True
        self._remove_done()

    def _fail_all(self, error: Exception) -> None:
        for seq in [*self._active, *self._prefilling]:
            if not seq.done:
                seq.done = True
                seq.deliver(error)
        self._active, self._prefilling = [], []
        self._cache, self._mask, self._next_pos = None, None, None

    # ----- one token of one sequence -------------------------------------------------

    def _accept(self, seq: Sequence, logits: torch.Tensor) -> None:
        if seq.cancelled.is_set():
            seq.done = True
            return
        seen = torch.tensor(seq.prompt + seq.generated, device=self.device)
        generated = torch.tensor(seq.generated, dtype=torch.long, device=self.device)
        allowed, banned = None, None
        if seq.constraint is not None:  # the grammar decides when the output may end
            allowed = torch.from_numpy(seq.constraint.allowed()).to(self.device)
        elif not may_end(seq.params, len(seq.generated)):
            banned = self._eos_tensor
        token = choose_token(logits, seq.params, seen, generated, seq.generator, banned=banned, allowed=allowed)
        if token in self.eos_ids:
            self._finish(seq, "stop", hit_stop=False)
            return
        if seq.constraint is not None:
            seq.constraint.advance(token)
        seq.generated.append(token)
        if seq.params.logprobs is not None:
            seq.pending.append(self._logprob(logits, token, seq.params.logprobs))
        text, hit_stop = seq.stops.feed(seq.detok.add(token), armed=len(seq.generated) >= seq.params.min_tokens)
        if text or hit_stop:
            seq.deliver(GenerationChunk(text, tuple(seq.pending)))
            seq.pending = []
        if hit_stop:
            self._finish(seq, "stop", hit_stop=True)
        elif seq.constraint is not None and seq.constraint.complete:
            self._finish(seq, "stop", hit_stop=False)
        elif len(seq.generated) >= seq.max_new:
            self._finish(seq, "length", hit_stop=False)

    def _finish(self, seq: Sequence, reason: str, *, hit_stop: bool) -> None:
        tail = ""
        if not hit_stop:
            tail, hit = seq.stops.feed(seq.detok.flush())
            tail += "" if hit else seq.stops.flush()
        seq.deliver(GenerationChunk(tail, tuple(seq.pending), reason, Usage(len(seq.prompt), len(seq.generated))))
        seq.deliver(END)
        seq.done = True

    def _logprob(self, logits: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top: tuple[TopLogprob, ...] = ()
        if top_n:
            values, indices = torch.topk(logprobs, top_n)
            top = tuple(self._top(int(i), float(v)) for v, i in zip(values, indices, strict=True))
        text = self.tokenizer.decode([token])
        return TokenLogprob(text, float(logprobs[token]), tuple(text.encode()), top, token_id=token)

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = self.tokenizer.decode([token])
        return TopLogprob(text, logprob, tuple(text.encode()))


def _run_job(fn: Callable[[], Any], future: Future[Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
