"""Run once at the end of the image build: fail the build, not the first request, when the
runtime stage lacks a shared library an engine imports, or a starter model's files are
missing. `starters` checks every starter model's files and the engines they need."""

import importlib
import sys

from modelpool.config.loader import load_config, starter_catalog
from modelpool.config.sources import resolve_source

# The engine modules the default extras bring; each imported so that a missing system
# library (libgomp1 and the like) shows here. One that is not installed (EXTRAS left out
# its extra) is skipped: the server answers 501 naming the extra for it.
ENGINES = ["llama_cpp", "torch", "sentence_transformers", "transformers", "ctranslate2", "faster_whisper",
           "piper", "av", "kokoro_onnx", "llguidance", "mcp"]


def main(starters: bool) -> None:
    for name in ENGINES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the engine is there but something it imports is not
                raise
            print(f"not installed: {name}")
    if starters:
        config = load_config(None, environ={})
        for model_id in starter_catalog():
            model = config.models[model_id]
            print(model_id, "->", resolve_source(model.source, model_id=model_id))


if __name__ == "__main__":
    main(starters=sys.argv[1:] == ["starters"])
