"""Constrained decoding with llguidance: a grammar becomes, at every step, the set of tokens
that keep the output inside it. One compiler per loaded model (it holds the model's
vocabulary); one `TokenConstraint` per sequence, so constrained and free sequences share a
batch. Compiled grammars are cached by their text, so a schema sent again costs a copy.

Why llguidance (see the issue note for the numbers): it enforces the whole of JSON schema
that matters here (bounds, enums, lengths), compiles a typical schema in about a
millisecond and computes a 49k-token mask in ~0.02 ms, and installs as one wheel with no
dependencies. llama.cpp's own JSON-schema grammar ignores `minimum`, so the llama.cpp
backend applies this mask to llama.cpp's logits instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelpool.errors import InvalidRequest

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer

CACHE_SIZE = 128
"""Compiled grammars kept per model (least recently used go first)."""
CACHE_TEXT_BYTES = 16 * 1024 * 1024
"""...and at most this much grammar text among them: a compiled grammar grows with its
text, and a client picks the text (a schema at `server.max_schema_bytes` is ~256 KB)."""
MAX_LEXER_STATES = 50_000
"""llguidance's lexer builds states lazily as it computes masks, ~1-2 kB each: this caps a
hostile grammar's lexer at ~100 MB (llguidance's own default, 250,000, allows ~500 MB).
A grammar that needs more fails its request (400), not the server."""


class TokenConstraint:
    """The grammar state of one sequence. Not thread-safe: one sequence, one thread."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, end_ids: npt.NDArray[np.intp], eos: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._end_ids = end_ids
        self._eos = eos
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Which tokens may come next (length: the model's vocabulary). When the grammar lets
        the output end, every end-of-generation token may come, not only the one the
        tokenizer calls EOS (<|im_end|> and <|endoftext|> alike)."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab_size].astype(bool)
        if mask[self._eos]:
            mask[self._end_ids] = True
        return mask

    def advance(self, token: int) -> None:
        """Move past the token that was chosen (it was allowed, so this cannot fail, except
        for an end token, which the caller handles)."""
        self._matcher.consume_token(token)

    @property
    def complete(self) -> bool:
        """Nothing more can be generated: the output must end now."""
        return bool(self._matcher.is_stopped())


class GrammarCompiler:
    """Compiles grammars for one model's vocabulary, with a cache keyed by grammar text."""

    def __init__(self, tokenizer: LLTokenizer, vocab_size: int, end_ids: Iterable[int], eos: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._end_ids = np.array(sorted(set(end_ids) | {eos}), dtype=np.intp)
        self._eos = eos
        self._cache: OrderedDict[str, LLMatcher] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    @property
    def cached(self) -> tuple[int, int]:
        """(compiled grammars kept, bytes of their text)."""
        with self._lock:
            return len(self._cache), self._cached_bytes

    def start(self, grammar: str, param: str) -> TokenConstraint:
        """A fresh constraint for one sequence. An invalid grammar (a schema llguidance
        cannot compile) is the request's fault: a 400 naming `param`."""
        return TokenConstraint(self._compiled(grammar, param).deep_copy(), self._vocab_size, self._end_ids, self._eos)

    def _compiled(self, grammar: str, param: str) -> LLMatcher:
        with self._lock:
            cached = self._cache.get(grammar)
            if cached is not None:
                self._cache.move_to_end(grammar)
                return cached
        from llguidance import LLMatcher, LLParserLimits

        limits = LLParserLimits(max_lexer_states=MAX_LEXER_STATES)
        matcher = LLMatcher(self._tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0, limits=limits)
        if matcher.is_error():
            raise InvalidRequest(f"the schema cannot be enforced: {matcher.get_error()}", param=param)
        with self._lock:
            if grammar not in self._cache:
                self._cache[grammar] = matcher
                self._cached_bytes += len(grammar)
            while len(self._cache) > CACHE_SIZE or self._cached_bytes > CACHE_TEXT_BYTES:
                evicted, _ = self._cache.popitem(last=False)
                self._cached_bytes -= len(evicted)
        return matcher
