"""A model's source as a CTranslate2 folder: a CT2 folder is used as it is; a Hugging Face
folder (a causal LM for the `ctranslate2` backend, a `WhisperForConditionalGeneration` for
`faster_whisper`; a GGUF is de-quantised to one first) is converted once into the work
dir and reused. The converted folder is keyed by the source's files, the quantization and
CTranslate2's version, so a changed source or quantization converts again. One
conversion of a target runs at a time, across threads (replicas) and processes (an
exclusive `flock` beside it): a second load waits for the first and takes its folder.

The tokenizer files (and the chat template, and Whisper's `preprocessor_config.json`,
where faster-whisper reads its mel size) are copied next to the CT2 weights, and what the
runtime needs from the Hugging Face config (context length, end tokens) is kept in
`modelpool.json`, since CT2 writes its own `config.json`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.built_once import build_lock, building
from modelpool.errors import ModelLoadFailed

log = logging.getLogger("modelpool.backends")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
)
FACTS_FILE = "modelpool.json"
"""Facts from the Hugging Face config that the CT2 folder does not keep."""
_CONVERT_BYTES_PER_S = 30e6
"""Float32 source weights converted per second on 2 CPU cores (SmolLM2-135M: ~18 s)."""
ComputeType = Literal[
    "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32"
]
"""CTranslate2's compute types (the ctranslate2 and faster_whisper backends' option); a
converted model is quantized to the chosen one, `auto` first made concrete by the backend."""
QUANTIZATIONS = frozenset(get_args(ComputeType)) - {"auto"}


@dataclass(frozen=True)
class ModelFacts:
    context_length: int | None
    """The model's own limit (max_position_embeddings), when the source says it."""
    end_ids: tuple[int, ...]
    """End-of-sequence ids from the generation config (the tokenizer's EOS is added at load)."""


def is_ct2_folder(path: Path) -> bool:
    return path.is_dir() and (path / "model.bin").is_file() and (path / "config.json").is_file()


def ct2_folder_for(source: Path, work_dir: Path, quantization: str) -> Path:
    """The CT2 folder for `source` at `quantization`, converted (once) if it is not one."""
    if is_ct2_folder(source):
        return source
    if quantization not in QUANTIZATIONS:  # it names a folder: only the converter's own words
        raise ModelLoadFailed(f"{quantization!r} is not a quantization CTranslate2 converts to "
                              f"({', '.join(sorted(QUANTIZATIONS))})")  # fmt: skip
    hf = hf_folder_for(source, work_dir) if source.is_file() and source.suffix == ".gguf" else source
    if not (hf.is_dir() and (hf / "config.json").is_file()):
        raise ModelLoadFailed(f"{source} is neither a CTranslate2 folder (model.bin + config.json), "
                              "a Hugging Face model folder nor a GGUF file")  # fmt: skip
    target = work_dir / "ct2" / f"{hf.name}-{_fingerprint(hf)}-{quantization}-ct2-{_ct2_version()}"
    if is_ct2_folder(target):
        return target
    with build_lock(target):
        if not is_ct2_folder(target):  # another load may have converted it while this one waited
            _convert(hf, target, quantization)
    return target


def read_facts(folder: Path) -> ModelFacts:
    """What `modelpool.json` says (written at conversion); nothing for a CT2 folder made elsewhere."""
    try:
        data = json.loads((folder / FACTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ModelFacts(None, ())
    limit = data.get("context_length")
    return ModelFacts(int(limit) if limit else None, tuple(int(t) for t in data.get("end_ids") or ()))


def _convert(hf: Path, target: Path, quantization: str) -> None:
    try:
        from ctranslate2.converters import TransformersConverter
        from safetensors import SafetensorError
    except ImportError as exc:
        raise ModelLoadFailed("converting a model for CTranslate2 needs ctranslate2: "
                              "pip install 'modelpool[ctranslate2]'") from exc  # fmt: skip
    weights = sum(p.stat().st_size for p in hf.glob("*.safetensors")) + sum(p.stat().st_size for p in hf.glob("*.bin"))
    expected_s = max(5, round(weights / _CONVERT_BYTES_PER_S))
    log.info(f"converting {hf} to CTranslate2 ({quantization}) once, ~{expected_s} s", extra={"into": str(target)})
    began = time.monotonic()
    try:
        with building(target) as partial:  # a replica that did not take the lock keeps the first folder
            copied = [name for name in TOKENIZER_FILES if (hf / name).is_file()]
            converter = TransformersConverter(str(hf), copy_files=copied)
            with MODEL_CONSTRUCTION:  # the converter loads the model through transformers
                converter.convert(str(partial), quantization=quantization, force=True)
            (partial / FACTS_FILE).write_text(json.dumps(_facts_of(hf)), encoding="utf-8")
    # NotImplementedError: CTranslate2's converter has no loader for this architecture;
    # KeyError/AttributeError: a config missing what the converter reads; SafetensorError:
    # a truncated weight file (a broken or half-copied folder).
    except (OSError, ValueError, RuntimeError, NotImplementedError, KeyError, AttributeError, SafetensorError) as exc:
        raise ModelLoadFailed(f"cannot convert {hf} for CTranslate2: {exc}") from exc
    log.info(f"converted {hf.name} to CTranslate2 in {time.monotonic() - began:.1f} s", extra={"into": str(target)})


def _facts_of(hf: Path) -> dict[str, Any]:
    config = _json(hf / "config.json")
    text_config = config.get("text_config") or config  # a multimodal config keeps it inside
    generation = _json(hf / "generation_config.json")
    ends = generation.get("eos_token_id", text_config.get("eos_token_id"))
    end_ids = ends if isinstance(ends, list) else [ends] if isinstance(ends, int) else []
    return {"context_length": text_config.get("max_position_embeddings"), "end_ids": end_ids}


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprint(folder: Path) -> str:
    """Every file's name, size and modification time: a changed source gets a new folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def _ct2_version() -> str:
    import ctranslate2

    return str(ctranslate2.__version__)
