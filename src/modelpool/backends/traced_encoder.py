"""A sentence-transformers encoder's transformer traced to TorchScript once at load (CPU).

Why, measured on the 2-core VM (all-MiniLM-L6-v2, one-sentence requests, two compute lanes
of one thread each): the eager forward runs a few hundred small PyTorch ops from Python, and
each op takes the GIL back when it ends, so the two lanes and the event loop queue for it
(a fifth of the machine sat idle under `wrk -t1 -c32`, every thread waiting). Traced, the
forward runs as one graph in C++: the server answered 261-300 requests/s against 174-203
eager (benchmarks/bench_embeddings_wrk.py, A/B twice), and in one process two lanes beside
a thread holding the GIL 30% of the time embedded 1.4x (batches of 16) to 2.3x (batches of
4) the sentences/s.

PyTorch never frees a trace's code (TorchScript registers it for the life of the process:
measured 6-10 MiB a trace of MiniLM), so a trace is made once per model source and kept in
a pool here: an unloaded encoder gives its trace back with its weights unbound, and the
next load of that source binds its own weights to it. The weights are the trace's
attributes, not constants folded into it, so they are freed with the model; the memory a
load and unload cycle keeps is bounded by the encoders of one source loaded at once.

A trace records one run's operations; a model whose forward branches on its inputs in Python
could record a path that is wrong for other inputs. So the traced forward is kept only when
it gives what the eager forward gives on probes of other shapes (padded and not, one row and
several); otherwise the eager forward stays and the log says why. Imported when an encoder
loads (it imports PyTorch).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from modelpool.quiet_warnings import ignoring

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


PROBES = (
    ["a"],
    ["the first probe sentence, a little longer than the next", "short one"],
    ["three rows", "of different lengths to pad", "x"],
)
"""Texts the traced forward must encode as the eager one does (the trace uses the second)."""
TOLERANCE = 1e-5
"""Largest difference allowed in a probe's embedding (float32; oneDNN may order sums differently)."""


class TracedEncoder:
    """The sentence embeddings of prepared features: the traced transformer, then the
    model's own later modules (pooling, normalising) as they are. `release()` at unload."""

    def __init__(self, trace: _Trace, rest: Sequence[Any]) -> None:
        self._trace: _Trace | None = trace
        self._rest = rest

    def __call__(self, features: dict[str, Any]) -> torch.Tensor:
        trace = self._trace
        assert trace is not None, "a released encoder is not called (the backend drops it at unload)"
        features = dict(features)
        # What the Transformer module hands the next one (Pooling reads it), in every version.
        features["token_embeddings"] = trace.graph(*(features[name] for name in trace.inputs))
        for module in self._rest:
            features = module(features)
        embedded: torch.Tensor = features["sentence_embedding"]
        return embedded

    def release(self) -> None:
        """Unbind the weights and give the trace back to the pool (once)."""
        trace, self._trace = self._trace, None
        if trace is not None:
            trace.unbind()
            _POOL.give_back(trace)


def trace_encoder(st: SentenceTransformer, source: str) -> TracedEncoder | str:
    """The traced encoder (a pooled trace of `source` when one is free), or why the eager
    forward stays."""
    modules = list(st)
    if not modules or type(modules[0]).__name__ != "Transformer":
        return "the first module is not a sentence-transformers Transformer"
    if st.device.type != "cpu":
        return f"the model is on {st.device.type} (tracing is for the CPU)"
    model = modules[0].auto_model  # the Hugging Face model (3.x-5.x attribute, 6.x property)
    if not isinstance(model, torch.nn.Module):
        return "the Transformer module holds no PyTorch model"
    inputs = _input_names(st)
    tensors = _weights(model)
    key = (source, inputs, tuple((name, tuple(t.shape), t.dtype) for name, t in tensors))
    earlier = _POOL.refusal(key)
    if earlier is not None:
        return earlier
    trace = _POOL.take(key)
    try:
        # TracerWarnings name Python values recorded as constants: the probes judge them.
        with (
            torch.inference_mode(),
            ignoring(torch.jit.TracerWarning),  # type: ignore[attr-defined]  # public, not in __all__
            ignoring(DeprecationWarning, r"`torch\.jit\."),  # PyTorch 2.10+ deprecates tracing; it still works
        ):
            if trace is None:
                trace = _Trace.record(key, model, inputs, _tokenized(st, PROBES[1]))
            else:
                trace.bind(tensors)
            difference = _probe_difference(st, TracedEncoder(trace, modules[1:]))
            refused = None
            if not difference <= TOLERANCE:
                refused = f"the traced forward differs from the eager one by {difference:.2g} on a probe"
    except Exception as exc:  # tracing is an optimisation: any failure keeps the eager forward
        refused = f"tracing failed: {type(exc).__name__}: {exc}"
    if refused is not None:
        # Not tried again for this source and layout (each trace's code stays for good),
        # and a wrong trace never goes back to the pool.
        if trace is not None:
            trace.unbind()
        _POOL.refuse(key, refused)
        return refused
    assert trace is not None  # recorded or taken, and probed
    return TracedEncoder(trace, modules[1:])


def _probe_difference(st: SentenceTransformer, encoder: TracedEncoder) -> float:
    """The largest difference from the eager forward over the probes."""
    difference = 0.0
    for texts in PROBES:
        features = _tokenized(st, texts)
        eager = st.forward(dict(features))["sentence_embedding"]
        difference = max(difference, float((encoder(features) - eager).abs().max()))
    return difference


class _Weights(torch.nn.Module):
    """The model's token embeddings from its inputs given in order, with every weight the
    model reads as an attribute of this one module (w0, w1, ...): the trace reads them from
    there, so another model's weights can be bound to it, and it is one module (a trace
    makes code per submodule, all of it kept)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self._model = [model]  # in a list: not a submodule
        self.names = names
        for index, (_, tensor) in enumerate(_weights(model)):
            self.register_buffer(f"w{index}", tensor, persistent=False)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        out = self._model[0](**dict(zip(self.names, tensors, strict=True)), return_dict=True)
        hidden: torch.Tensor = out.last_hidden_state
        return hidden


_Key = tuple[str, tuple[str, ...], tuple[tuple[str, tuple[int, ...], torch.dtype], ...]]


class _Trace:
    """A traced forward, its weights bound or not."""

    def __init__(self, key: _Key, graph: Any, inputs: tuple[str, ...], count: int) -> None:
        self.key = key
        self.graph = graph
        self.inputs = inputs
        self.count = count

    @classmethod
    def record(
        cls, key: _Key, model: torch.nn.Module, inputs: tuple[str, ...], example: dict[str, torch.Tensor]
    ) -> _Trace:
        model.requires_grad_(False)  # served for inference only; a trace refuses weights that want gradients
        wrapped = _Weights(model, inputs)
        graph = torch.jit.trace(  # type: ignore[no-untyped-call]
            wrapped, tuple(example[name] for name in inputs), check_trace=False
        )
        return cls(key, graph, inputs, len(_weights(model)))

    def bind(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        for index, (_, tensor) in enumerate(tensors):
            setattr(self.graph, f"w{index}", tensor)

    def unbind(self) -> None:
        for index in range(self.count):
            setattr(self.graph, f"w{index}", _EMPTY)


_EMPTY = torch.empty(0)


class _TracePool:
    """Traces not in use, by the model source and weight layout they were made for, and
    the sources whose trace was refused (with why)."""

    def __init__(self) -> None:
        self._free: dict[_Key, list[_Trace]] = {}
        self._refused: dict[_Key, str] = {}
        self._lock = threading.Lock()

    def take(self, key: _Key) -> _Trace | None:
        with self._lock:
            free = self._free.get(key)
            return free.pop() if free else None

    def give_back(self, trace: _Trace) -> None:
        with self._lock:
            self._free.setdefault(trace.key, []).append(trace)

    def free_count(self) -> int:
        with self._lock:
            return sum(len(traces) for traces in self._free.values())

    def refusal(self, key: _Key) -> str | None:
        with self._lock:
            return self._refused.get(key)

    def refuse(self, key: _Key, reason: str) -> None:
        with self._lock:
            self._refused[key] = reason


_POOL = _TracePool()


def _weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every tensor the model holds (parameters, then buffers), in a stable order."""
    return [*model.named_parameters(), *model.named_buffers()]


def _input_names(st: SentenceTransformer) -> tuple[str, ...]:
    """The encoder's inputs, in the trace's order: token type ids when the tokenizer makes
    them (as the backend's batches give them)."""
    types = ("token_type_ids",) if "token_type_ids" in st.tokenizer.model_input_names else ()
    return ("input_ids", "attention_mask", *types)


def _tokenized(st: SentenceTransformer, texts: list[str]) -> dict[str, torch.Tensor]:
    features = st.tokenizer(texts, padding=True, return_tensors="pt")
    return {name: features[name].to(st.device) for name in _input_names(st)}
