"""What a GGUF's metadata says about the model: its architecture, name, trained context,
quantisation, whether it carries a chat template, and whether it embeds rather than
generates. Read through a FileView with a growing head (most headers fit in 2 MiB; a
256k-token vocabulary needs ~8 MiB), never past READ_CAP."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from modelpool.detect.gguf import GgufHeader, NeedMoreBytes, parse_header
from modelpool.detect.view import FileView
from modelpool.errors import ModelSourceError

HEAD_SIZES = (2 * 1024 * 1024, 16 * 1024 * 1024, 64 * 1024 * 1024)
READ_CAP = HEAD_SIZES[-1]
"""The most bytes of one file detection reads: a header beyond it is refused."""

FILE_TYPES: Mapping[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
"""`general.file_type` → the quantisation's usual name (llama.cpp's LLAMA_FTYPE_MOSTLY_*)."""

ENCODER_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert", "modern-bert", "t5encoder",
     "eurobert"}
)  # fmt: skip
"""Architectures llama.cpp runs as text encoders (embeddings), never as generators."""

PROJECTOR_ARCHITECTURE = "clip"
"""What llama.cpp's vision/audio projectors (`mmproj-*.gguf`) call themselves."""

POOLING_TYPES: Mapping[int, str] = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


@dataclass(frozen=True)
class GgufFacts:
    architecture: str
    name: str | None
    context_length: int | None
    quantization: str | None
    chat_template: bool
    pooling: str | None
    """`<arch>.pooling_type` when the file sets one: an embedding (or, "rank", reranking) model."""
    size_label: str | None
    """`general.size_label` ("135M", "7B") when the file says it."""

    @property
    def embeds(self) -> bool:
        return self.architecture in ENCODER_ARCHITECTURES or self.pooling in ("mean", "cls", "last")


def read_gguf(view: FileView, name: str, *, label: str) -> GgufHeader:
    """The header of `name` in `view`, reading a longer head only while the header goes on."""
    for size in HEAD_SIZES:
        head = view.read_head(name, size)
        if head is None:
            raise ModelSourceError(f"{label}: cannot read {name}")
        try:
            return parse_header(head, complete=len(head) < size, label=f"{label} ({name})")
        except NeedMoreBytes:
            continue
    raise ModelSourceError(f"{label} ({name}): the GGUF metadata is larger than the {READ_CAP:,} bytes detection reads")


def gguf_facts(header: GgufHeader, *, label: str) -> GgufFacts:
    architecture = header.text("general.architecture")
    if not architecture:
        raise ModelSourceError(f"{label}: the GGUF names no general.architecture")
    file_type = header.number("general.file_type")
    pooling = header.number(f"{architecture}.pooling_type")
    return GgufFacts(
        architecture=architecture,
        name=header.text("general.name"),
        context_length=header.number(f"{architecture}.context_length"),
        quantization=FILE_TYPES.get(file_type, f"type {file_type}") if file_type is not None else None,
        chat_template=header.has("tokenizer.chat_template"),
        pooling=POOLING_TYPES.get(pooling, str(pooling)) if pooling is not None else None,
        size_label=header.text("general.size_label"),
    )
