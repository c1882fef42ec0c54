"""A GGUF file as a Hugging Face model folder: de-quantised once into a cache folder and
reused (transformers reads GGUF through the `gguf` package; ~15 s for a 135M model)."""

from __future__ import annotations

import logging
from pathlib import Path

from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.built_once import build_lock, building
from modelpool.errors import ModelLoadFailed

log = logging.getLogger("modelpool.backends")


def hf_folder_for(gguf: Path, cache_root: Path) -> Path:
    """The converted folder for `gguf`, made if missing. Keyed by name, size and mtime."""
    stat = gguf.stat()
    target = cache_root / "gguf-to-hf" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "config.json").is_file():
        return target
    with build_lock(target):
        if not (target / "config.json").is_file():  # another process may have made it meanwhile
            _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    log.info("converting GGUF to a Hugging Face folder (once)", extra={"gguf": str(gguf), "into": str(target)})
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadFailed("converting a GGUF needs transformers: pip install 'modelpool[transformers]'") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        with MODEL_CONSTRUCTION:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ImportError, OSError, ValueError) as exc:
        raise ModelLoadFailed(f"cannot convert {gguf} for transformers (needs the gguf package): {exc}") from exc
    # A de-quantised model is a plain float model: drop the GGUF quantizer marker, or
    # save_pretrained writes a config that asks for GGUF again.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module.__setattr__ as Tensor|Module only; any value is stored
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with building(target) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
