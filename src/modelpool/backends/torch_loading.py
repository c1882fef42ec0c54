"""One model construction at a time in this process, for every backend that builds a
PyTorch model through transformers (transformers, CTranslate2's conversion, the
sentence-transformers backends).

transformers 5's `from_pretrained` swaps class-level functions for the duration of a load
(`no_tie_weights` replaces `PreTrainedModel.tie_weights`, `no_init_weights` the torch init
functions) and puts back what it saw on entry. Two loads in two threads interleave: the
second saves the first one's stand-in as "the original" and restores it last, so weight
tying stays switched off in the process for good; every later model with tied embeddings
then loads with a missing `lm_head` ("Cannot copy out of meta tensor"). Seen in the test
suite when a reranker and an embedding model preloaded together before a transformers load.
"""

from __future__ import annotations

import threading

MODEL_CONSTRUCTION = threading.Lock()
"""Held while a model is built from its files (not while it runs)."""
