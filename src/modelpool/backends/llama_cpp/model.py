"""A GGUF model's weights and vocabulary through llama-cpp-python's low-level API, with no
context of its own: the batch engine makes the one context that serves every sequence.

Tokenizing and detokenizing read the vocabulary only, so any thread may call them.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from modelpool.errors import ModelLoadFailed
from modelpool.quiet_warnings import ignoring

if TYPE_CHECKING:
    from llguidance import LLTokenizer

_backend_ready = threading.Lock()
_backend_initialised = False


def init_llama_backend() -> None:
    """Once per process: llama.cpp's global backend state, with its logging turned down to
    errors (it logs every tensor while loading)."""
    global _backend_initialised
    import llama_cpp

    with _backend_ready:
        if not _backend_initialised:
            # llama-cpp-python routes llama.cpp's log lines to this logger's level.
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            llama_cpp.llama_backend_init()
            _backend_initialised = True


class GgufModel:
    def __init__(
        self, path: str, *, n_gpu_layers: int = 0, use_mmap: bool = True, model_id: str, vocab_only: bool = False
    ) -> None:
        import llama_cpp

        init_llama_backend()
        self._llama = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        params.use_mmap = use_mmap
        params.vocab_only = vocab_only
        model = llama_cpp.llama_model_load_from_file(path.encode("utf-8"), params)
        if not model:
            raise ModelLoadFailed(f"model '{model_id}': llama.cpp could not load {path}")
        self.model: Any = model
        self.vocab: Any = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.adds_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))

    def close(self) -> None:
        if self.model:
            self._llama.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        encoded = text.encode("utf-8")
        capacity = len(encoded) + 2
        buffer = (self._llama.llama_token * capacity)()
        count = self._llama.llama_tokenize(self.vocab, encoded, len(encoded), buffer, capacity, add_bos, special)
        if count < 0:  # too small a buffer: -count is the size needed
            capacity = -count
            buffer = (self._llama.llama_token * capacity)()
            count = self._llama.llama_tokenize(self.vocab, encoded, len(encoded), buffer, capacity, add_bos, special)
        return list(buffer[:count])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token; `special` shows control tokens (<|im_end|>) as text."""
        table = self._special_pieces if special else self._pieces
        return table[token] if 0 <= token < len(table) else b""

    def detokenize(self, tokens: list[int], *, special: bool = False) -> bytes:
        return b"".join(self.piece(t, special=special) for t in tokens)

    def spelling(self, token: int) -> str:
        """The token as the vocabulary spells it (`Ġworld` for a GPT-2 style BPE)."""
        text: bytes | None = self._llama.llama_vocab_get_text(self.vocab, token)
        return (text or b"").decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(self._llama.llama_vocab_is_eog(self.vocab, token))

    @cached_property
    def eog_set(self) -> frozenset[int]:
        return frozenset(int(t) for t in self.eog_ids)

    @cached_property
    def eog_ids(self) -> npt.NDArray[np.intc]:
        """Every end-of-generation token (EOS, EOT, <|im_end|>, ...)."""
        return np.array([t for t in range(self.n_vocab) if self.is_eog(t)], dtype=np.intc)

    def metadata(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = self._llama.llama_model_meta_val_str(self.model, key.encode(), buffer, size)
            if length < 0:
                return None
            if length < size:
                return buffer.value.decode("utf-8", errors="replace")
            size = length + 1  # a chat template longer than the buffer

    # Pieces are looked up once per vocabulary entry (~40 ms for 49k) instead of one
    # ctypes call per generated token, which a batch of 16 streams would pay 16 times a step.
    @cached_property
    def _pieces(self) -> list[bytes]:
        return [self._token_to_piece(t, special=False) for t in range(self.n_vocab)]

    @cached_property
    def _special_pieces(self) -> list[bytes]:
        return [self._token_to_piece(t, special=True) for t in range(self.n_vocab)]

    def _token_to_piece(self, token: int, *, special: bool) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        length = self._llama.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = self._llama.llama_token_to_piece(self.vocab, token, buffer, -length, 0, special)
        return buffer.raw[:length]


def grammar_tokenizer(model: GgufModel) -> LLTokenizer:
    """llguidance's view of the model's vocabulary (the model must outlive it). Its builder
    calls a llama.cpp function that llama-cpp-python marks deprecated, once per token: the
    warning is silenced here."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    with ignoring(DeprecationWarning):
        return lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab, eos_token=model.eos)
