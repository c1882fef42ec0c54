"""Which of a repo's files a backend needs: weights, tokenizer and config — never every format.

A Hugging Face repo often carries the same weights several times (safetensors and
`pytorch_model.bin`, ONNX, Flax, TensorFlow) and a GGUF repo every quantisation: a pull takes
only what the chosen backend loads.

- GGUF backends (llama_cpp, llama_server): the file named, or the quant tag's file, or the
  default quant (Q4_K_M, else the only one); every part of a split model
  (`-00001-of-00003.gguf`); the vision projector (`mmproj*.gguf`) beside it.
- Hugging Face folders (transformers, sentence_transformers, cross_encoder, vllm_serve):
  JSON and text files, tokenizer files, safetensors — `*.bin` only when there are no
  safetensors; no ONNX/Flax/TF/GGUF/OpenVINO.
- CTranslate2 and faster-whisper: `model.bin` and the JSON/text files beside it.
- Piper, Kokoro: ONNX voices with their JSON, voice tables.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from modelpool.errors import ModelSourceError
from modelpool.hub.reference import Selector

GGUF_BACKENDS = frozenset({"llama_cpp", "llama_server"})
CT2_BACKENDS = frozenset({"ctranslate2", "faster_whisper"})
VOICE_BACKENDS = frozenset({"piper", "kokoro"})
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
"""The quant taken when none is named and the repo has several (llama.cpp's and Ollama's habit)."""

HF_PATTERNS = (
    "*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py",
    "tokenizer*", "vocab*", "merges*", "spiece*", "sentencepiece*",
)  # fmt: skip
NEVER = ("*.onnx", "*.onnx_data", "*.msgpack", "*.h5", "*.ot", "*.tflite", "*.gguf", "*.ggml", "*.mlmodel",
         "*.pth", "*.pt", "*.ckpt", "*.npz", "onnx/*", "openvino/*", "coreml/*", "*.md", ".gitattributes")  # fmt: skip
CT2_PATTERNS = ("model.bin", "*.json", "*.txt", "vocabulary*", "tokenizer*", "*.model")
VOICE_PATTERNS = ("*.onnx", "*.onnx.json", "*.json", "*.npz", "voices*", "*.txt")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def files_for(backend: str, listing: Sequence[str], selector: Selector) -> list[str]:
    """The repo paths (from `listing`) that `backend` needs, sorted (backend "": every file
    but the docs, as a repo is before its backend is known). A quant tag or a `.gguf` file
    chooses GGUF files whatever the backend (transformers and CTranslate2 convert them). ModelSourceError when
    the selector matches nothing (it lists what there is) or the repo has no such files."""
    if selector.filename is not None and selector.filename not in listing:
        raise ModelSourceError(f"no file '{selector.filename}' in the repo (it has: {_sample(listing)})")
    if backend in GGUF_BACKENDS or _is_gguf_choice(selector) or selector.quant is not None:
        return _gguf_files(listing, selector)
    if selector.filename is not None:
        return [selector.filename]
    if not backend:  # no backend known yet (detection looks at the repo as it is): all of it
        return sorted(name for name in listing if not _excluded(name, ("*.md", ".gitattributes")))
    if backend in CT2_BACKENDS and "model.bin" in listing:
        chosen = _matching(listing, CT2_PATTERNS)
    elif backend in VOICE_BACKENDS:
        chosen = _matching(listing, VOICE_PATTERNS, never=("*.md", ".gitattributes"))
    else:
        chosen = _hf_files(listing)
    if not chosen:
        raise ModelSourceError(f"the repo has no files backend '{backend}' loads (it has: {_sample(listing)})")
    return chosen


def quant_tags(listing: Sequence[str]) -> list[str]:
    """The quant tags a GGUF repo offers (from its file names), for messages and `show`."""
    tags = {_quant_of(name) for name in _model_ggufs(listing)}
    return sorted(tag for tag in tags if tag)


def split_parts(name: str, listing: Sequence[str]) -> list[str]:
    """Every part of the split GGUF `name` belongs to (just `name` when it is whole)."""
    found = _SPLIT.match(PurePosixPath(name).name)
    if found is None:
        return [name]
    folder = str(PurePosixPath(name).parent)
    prefix = "" if folder == "." else folder + "/"
    count = int(found["count"])
    parts = [f"{prefix}{found['stem']}-{i:05d}-of-{found['count']}.gguf" for i in range(1, count + 1)]
    if missing := [p for p in parts if p not in listing]:
        raise ModelSourceError(f"split model {name} misses part(s) {', '.join(missing)}")
    return parts


def _gguf_files(listing: Sequence[str], selector: Selector) -> list[str]:
    models = _model_ggufs(listing)
    if selector.filename is not None:
        chosen = selector.filename
    elif selector.quant is not None:
        chosen = _by_quant(models, selector.quant)
    else:
        chosen = _default_gguf(models)
    files = split_parts(chosen, listing)
    if projector := _mmproj(listing, selector.quant):
        files.append(projector)
    return sorted(files)


def _by_quant(models: list[str], quant: str) -> str:
    tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    matches = sorted({_first_part(name) for name in models if tag.search(PurePosixPath(name).name)})
    if not matches:
        raise ModelSourceError(
            f"no GGUF file with quant tag {quant} (the repo has: {', '.join(quant_tags(models)) or 'none'})"
        )
    if len(matches) > 1:
        raise ModelSourceError(
            f"quant tag {quant} matches several files ({', '.join(matches)}): name one with :file.gguf"
        )
    return matches[0]


def _default_gguf(models: list[str]) -> str:
    whole = sorted({_first_part(name) for name in models})
    if not whole:
        raise ModelSourceError("the repo has no GGUF model file")
    if len(whole) == 1:
        return whole[0]
    for quant in DEFAULT_QUANTS:
        tag = re.compile(rf"(?<![A-Za-z0-9]){quant}(?![A-Za-z0-9_])", re.IGNORECASE)
        if found := [name for name in whole if tag.search(PurePosixPath(name).name)]:
            return found[0]
    tags = ", ".join(quant_tags(models)) or ", ".join(whole)
    raise ModelSourceError(
        f"the repo has several GGUF files and none is {'/'.join(DEFAULT_QUANTS)}: "
        f"choose one of {tags} (hf:org/repo:TAG)"
    )


def _mmproj(listing: Sequence[str], quant: str | None) -> str | None:
    """The vision projector: the one of the quant asked for, else an f16 one, else the first."""
    projectors = sorted(name for name in listing if _is_mmproj(name))
    if not projectors:
        return None
    for wanted in (quant, "f16", "bf16"):
        if wanted and (same := [p for p in projectors if wanted.lower() in PurePosixPath(p).name.lower()]):
            return same[0]
    return projectors[0]


def _model_ggufs(listing: Sequence[str]) -> list[str]:
    return [name for name in listing if name.lower().endswith(".gguf") and not _is_mmproj(name)]


def _is_mmproj(name: str) -> bool:
    return name.lower().endswith(".gguf") and "mmproj" in PurePosixPath(name).name.lower()


def _is_gguf_choice(selector: Selector) -> bool:
    return selector.filename is not None and selector.filename.lower().endswith(".gguf")


def _first_part(name: str) -> str:
    found = _SPLIT.match(PurePosixPath(name).name)
    if found is None:
        return name
    return str(PurePosixPath(name).with_name(f"{found['stem']}-00001-of-{found['count']}.gguf"))


def _quant_of(name: str) -> str | None:
    found = re.search(
        r"(?<![A-Za-z0-9])(I?Q\d[A-Z0-9_]*?|F16|BF16|F32)(?=(-\d{5}-of-\d{5})?\.gguf$)",
        PurePosixPath(name).name,
        re.IGNORECASE,
    )
    return found.group(1).upper() if found else None


def _hf_files(listing: Sequence[str]) -> list[str]:
    chosen = _matching(listing, HF_PATTERNS)
    has_safetensors = any(name.endswith(".safetensors") for name in chosen)
    if not has_safetensors:  # older repos ship only PyTorch pickles
        chosen += [name for name in listing if name.endswith(".bin") and not _excluded(name)]
    return sorted(set(chosen))


def _matching(listing: Sequence[str], patterns: Sequence[str], never: Sequence[str] = NEVER) -> list[str]:
    return sorted(name for name in listing if not _excluded(name, never) and _matches(name, patterns))


def _matches(name: str, patterns: Sequence[str]) -> bool:
    base = PurePosixPath(name).name
    return any(fnmatch.fnmatch(base, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _excluded(name: str, never: Sequence[str] = NEVER) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in never) and not name.endswith(".onnx.json")


def _sample(listing: Sequence[str]) -> str:
    names = sorted(listing)
    return ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
