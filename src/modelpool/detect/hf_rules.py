"""Hugging Face and CTranslate2 folders, told apart by their `config.json`.

A Hugging Face config names `architectures` (and `model_type`); CTranslate2's converter
writes a config without them beside `model.bin`. Read in this order, first match wins:
a CT2 folder (Whisper when the config carries Whisper's alignment heads or language ids,
else a decoder LLM); a Hugging Face Whisper (`faster_whisper`, which converts it to CT2
once); a one-label sequence classifier (a cross-encoder); a
sentence-transformers folder (`modules.json`, `sentence_bert_config.json`); a
vision-language model (a `vision_config`); a causal LM; a bare text encoder (embeddings
through sentence-transformers' default mean pooling)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from modelpool.detect.result import Detected
from modelpool.detect.view import FileView
from modelpool.errors import ModelSourceError
from modelpool.tasks import Task

CONFIG_LIMIT = 4 * 1024 * 1024
"""Largest JSON config read (tokenizer configs with inline templates reach ~1 MB)."""
VOCABULARY_LIMIT = 8 * 1024 * 1024
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
WHISPER_CT2_KEYS = ("alignment_heads", "lang_ids", "suppress_ids_begin")
WHISPER_MULTILINGUAL_VOCABULARY = 51865
"""Whisper's multilingual models have this many tokens; the English-only `.en` ones one fewer."""
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
ENCODER_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "nomic_bert", "modernbert", "electra", "deberta-v2",
     "camembert", "new", "gte"}
)  # fmt: skip
"""`model_type`s of text encoders that sentence-transformers embeds with mean pooling."""
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def read_json(view: FileView, name: str, *, label: str) -> dict[str, Any] | None:
    """A JSON object file, None when absent; a clear error when it is not JSON or too big."""
    if name not in view.names():
        return None
    text = view.read_text(name, CONFIG_LIMIT)
    if text is None:
        raise ModelSourceError(f"{label}: {name} is unreadable or larger than {CONFIG_LIMIT // 2**20} MiB")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ModelSourceError(f"{label}: {name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelSourceError(f"{label}: {name} does not hold a JSON object")
    return data


def detect_config_folder(view: FileView, config: Mapping[str, Any], *, label: str) -> Detected:
    """The model a folder with this `config.json` holds (ModelSourceError when no rule fits)."""
    names = set(view.names())
    architectures = [str(a) for a in config.get("architectures") or [] if isinstance(a, str)]
    model_type = str(config.get("model_type") or "")
    if "model.bin" in names and not architectures and not model_type:
        return _ct2(view, config, label=label)
    if model_type == "whisper" or "WhisperForConditionalGeneration" in architectures:
        return _hf_whisper(config)
    if any(a.endswith("ForSequenceClassification") for a in architectures) or _st_cross_encoder(view, label):
        return _classifier(config, architectures, label)
    if names.intersection(SENTENCE_TRANSFORMERS_FILES):
        found = sorted(names.intersection(SENTENCE_TRANSFORMERS_FILES))
        return _hf("sentence_transformers", (Task.EMBEDDING,), {}, f"sentence-transformers folder ({found[0]})", config)
    if "vision_config" in config:
        tasks = _generation_tasks(view, label)
        return _hf(
            "transformers", tasks, {"vision": True}, f"vision-language {_first(architectures, model_type)}", config
        )
    if any(a.endswith(CAUSAL_SUFFIXES) for a in architectures):
        return _hf("transformers", _generation_tasks(view, label), {}, f"causal LM {architectures[0]}", config)
    if model_type in ENCODER_TYPES:
        return _hf("sentence_transformers", (Task.EMBEDDING,), {}, f"text encoder {model_type} (mean pooling)", config)
    raise ModelSourceError(_unknown_architecture(label, architectures, model_type))


def _ct2(view: FileView, config: Mapping[str, Any], *, label: str) -> Detected:
    if any(key in config for key in WHISPER_CT2_KEYS):
        vocabulary = _vocabulary_size(view)
        english = vocabulary is not None and vocabulary < WHISPER_MULTILINGUAL_VOCABULARY
        options: dict[str, Any] = {"languages": ["en"]} if english else {}
        kind = "English-only" if english else "multilingual"
        return Detected(
            "faster_whisper", (Task.TRANSCRIPTION,), options, f"CTranslate2 Whisper ({kind})", architecture="whisper"
        )
    tasks = _generation_tasks(view, label)
    return Detected(
        "ctranslate2", tasks, {}, "CTranslate2 decoder (model.bin, no architectures)", architecture="ctranslate2"
    )


def _hf_whisper(config: Mapping[str, Any]) -> Detected:
    vocabulary = config.get("vocab_size")
    english = isinstance(vocabulary, int) and vocabulary < WHISPER_MULTILINGUAL_VOCABULARY
    options: dict[str, Any] = {"languages": ["en"]} if english else {}
    kind = "English-only" if english else "multilingual"
    detected = _hf("faster_whisper", (Task.TRANSCRIPTION,), options, f"Hugging Face Whisper ({kind}), converted to "
                   "CTranslate2 once at load", config)  # fmt: skip
    return replace(detected, context_length=None)  # max_position_embeddings is the decoder's, not a context


def _classifier(config: Mapping[str, Any], architectures: Sequence[str], label: str) -> Detected:
    labels = config.get("id2label")
    count = len(labels) if isinstance(labels, dict) and labels else config.get("num_labels", 1)
    if count != 1:
        raise ModelSourceError(
            f"{label}: {_first(architectures, '?')} with {count} labels is a classifier; modelpool serves "
            "one-label cross-encoders (rerank) only"
        )
    return _hf(
        "cross_encoder",
        (Task.RERANK,),
        {},
        f"cross-encoder {_first(architectures, 'CrossEncoder')} (one label)",
        config,
    )


def _st_cross_encoder(view: FileView, label: str) -> bool:
    """sentence-transformers 4+ may save a CrossEncoder with its own marker file."""
    saved = read_json(view, "config_sentence_transformers.json", label=label) or {}
    return saved.get("model_type") == "CrossEncoder"


def _generation_tasks(view: FileView, label: str) -> tuple[Task, ...]:
    names = set(view.names())
    tokenizer_config = read_json(view, "tokenizer_config.json", label=label) or {}
    templated = bool(names.intersection(TEMPLATE_FILES)) or "chat_template" in tokenizer_config
    return ((Task.CHAT,) if templated else ()) + (Task.COMPLETION, Task.SCORING)


def _hf(
    backend: str, tasks: tuple[Task, ...], options: dict[str, Any], reason: str, config: Mapping[str, Any]
) -> Detected:
    inner = config.get("text_config")
    text_config: Mapping[str, Any] = inner if isinstance(inner, dict) else {}
    context = config.get("max_position_embeddings") or text_config.get("max_position_embeddings")
    quantization = config.get("quantization_config")
    quant = quantization.get("quant_method") if isinstance(quantization, dict) else None
    dtype = config.get("dtype") or config.get("torch_dtype") or text_config.get("dtype")
    architectures = config.get("architectures") or []
    return Detected(
        backend,
        tasks,
        options,
        reason,
        architecture=str(architectures[0]) if architectures else str(config.get("model_type") or "") or None,
        context_length=context if isinstance(context, int) else None,
        quantization=str(quant or dtype) if (quant or dtype) else None,
    )


def _vocabulary_size(view: FileView) -> int | None:
    for name in ("vocabulary.json", "vocabulary.txt"):
        if name in view.names() and (text := view.read_text(name, VOCABULARY_LIMIT)) is not None:
            if name.endswith(".txt"):
                return len(text.splitlines())
            try:
                data = json.loads(text)
            except ValueError:
                return None
            return len(data) if isinstance(data, list) else None
    return None


def _first(items: Sequence[str], default: str) -> str:
    return items[0] if items else default


def _unknown_architecture(label: str, architectures: Sequence[str], model_type: str) -> str:
    named = ", ".join(architectures) or "no architectures"
    return (
        f"{label}: config.json names {named} (model_type '{model_type or '?'}'), which no rule recognises "
        "(looked for *ForCausalLM, Whisper, a vision_config, *ForSequenceClassification with one label, "
        "sentence-transformers files, an encoder model_type). Set `backend:` in a config entry."
    )
