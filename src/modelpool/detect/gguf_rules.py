"""GGUF files → llama.cpp. A generator runs in process (`llama_cpp`: chat when the file
carries a chat template, completions and scoring always); an encoder (BERT-like
architectures, or a file that sets a pooling type) runs for embeddings under llama.cpp's
server (`llama_server` with `embedding: true`), since the in-process engine only
generates. A `mmproj*.gguf` beside the model is its vision projector."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import replace
from posixpath import basename

from modelpool.detect.gguf_facts import PROJECTOR_ARCHITECTURE, GgufFacts, gguf_facts, read_gguf
from modelpool.detect.result import Detected
from modelpool.detect.view import FileView
from modelpool.errors import ModelSourceError
from modelpool.tasks import Task

DEFAULT_CONTEXT = 4096
"""llama_cpp's default `n_ctx`; a model trained on less gets its own length instead."""
_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def is_projector(name: str) -> bool:
    return basename(name).lower().startswith("mmproj")


def detect_gguf(view: FileView, selected: str | None, *, label: str) -> Detected:
    """The GGUF model in `view`: `selected` when the view is one file, else its only model
    GGUF (several are an error that lists them: the user names one)."""
    ggufs = [n for n in view.names() if is_gguf(n)]
    projectors = [n for n in ggufs if is_projector(n)]
    model = selected or _only_model([n for n in ggufs if n not in projectors], label)
    if is_projector(model):
        raise ModelSourceError(f"{label}: {model} is a vision projector; serve the model GGUF it belongs to")
    facts = gguf_facts(read_gguf(view, model, label=label), label=f"{label} ({model})")
    if facts.architecture == PROJECTOR_ARCHITECTURE:
        raise ModelSourceError(f"{label}: {model} is a projector (architecture clip), not a model")
    if facts.pooling == "rank":
        raise ModelSourceError(
            f"{label}: {model} is a GGUF reranker, which no modelpool engine serves; use its Hugging Face "
            "folder with `backend: cross_encoder`"
        )
    return _encoder(facts, model) if facts.embeds else _generator(facts, model, projectors)


def _generator(facts: GgufFacts, model: str, projectors: Sequence[str]) -> Detected:
    tasks = ((Task.CHAT,) if facts.chat_template else ()) + (Task.COMPLETION, Task.SCORING)
    options: dict[str, object] = {}
    if facts.context_length is not None and facts.context_length < DEFAULT_CONTEXT:
        options["n_ctx"] = facts.context_length
    seen = [
        f"GGUF {facts.architecture}",
        facts.quantization or "",
        "chat template" if facts.chat_template else "no chat template",
    ]
    if projectors:
        projector = projector_for(model, projectors, facts.quantization)
        options["mmproj"] = projector
        seen.append(f"vision projector {basename(projector)}")
    return _with_facts(
        Detected("llama_cpp", tasks, options, _reason(seen), model, ("mmproj",) if projectors else ()), facts
    )


def projector_for(model: str, projectors: Sequence[str], quantization: str | None) -> str:
    """The projector of the model's own quantisation when there are several (as the hub's
    pull picks it), else the f16 one, else the first by name."""

    def named(tag: str) -> list[str]:
        whole = re.compile(rf"(?<![a-z0-9]){re.escape(tag.lower())}(?![a-z0-9])")  # f16 is not in bf16
        return [p for p in sorted(projectors) if whole.search(basename(p).lower())]

    beside = [p for p in sorted(projectors) if posixpath.dirname(p) == posixpath.dirname(model)] or sorted(projectors)
    for tag in (quantization, "f16"):
        if tag and (found := [p for p in named(tag) if p in beside]):
            return found[0]
    return beside[0]


def _encoder(facts: GgufFacts, model: str) -> Detected:
    options: dict[str, object] = {"embedding": True}
    if facts.context_length is not None and facts.context_length < DEFAULT_CONTEXT:
        options["context_length"] = facts.context_length
    seen = [
        f"GGUF {facts.architecture}",
        facts.quantization or "",
        f"an encoder (pooling {facts.pooling or 'default'})",
    ]
    return _with_facts(Detected("llama_server", (Task.EMBEDDING,), options, _reason(seen), model), facts)


def _with_facts(detected: Detected, facts: GgufFacts) -> Detected:
    return replace(
        detected,
        architecture=facts.architecture,
        name=facts.name,
        context_length=facts.context_length,
        quantization=facts.quantization,
        size_label=facts.size_label,
    )


def _only_model(models: Sequence[str], label: str) -> str:
    """The one model among GGUF files; every part of a split model counts as its first part."""
    firsts = sorted({n for n in models if not (m := _SPLIT_PART.search(n)) or int(m.group(1)) == 1})
    if len(firsts) == 1:
        return firsts[0]
    if not firsts:
        raise ModelSourceError(f"{label}: no model GGUF (only projectors or split parts without their first part)")
    listed = ", ".join(firsts[:12]) + (", ..." if len(firsts) > 12 else "")
    raise ModelSourceError(
        f"{label} holds {len(firsts)} GGUF models ({listed}): name one file, or a quant tag for a hub repo "
        "(hf:org/repo:Q4_K_M)"
    )


def _reason(parts: Sequence[str]) -> str:
    return ", ".join(part for part in parts if part)
