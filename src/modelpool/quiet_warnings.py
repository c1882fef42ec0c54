"""A warning silenced around one call, from any thread.

`warnings.catch_warnings()` is not thread-safe: it saves the process's whole filter list and
puts that list back on exit, so a thread leaving it drops every filter another thread added
in the meantime. Seen in the test suite: a model load tracing its encoder on an engine
thread left its `catch_warnings` while FastAPI, on the event loop, was inside its own (which
ignores a pydantic warning while it builds a route at that route's first request); the
filter was gone, and the warning, an error under the tests' filters, became a 500.

`ignoring` adds one filter and takes out only that one (counted, so that threads silencing
the same warning at once share it), never putting back an older list. The filters stay
process-wide, as `catch_warnings` left them: a warning of that kind from another thread
meanwhile is silenced too.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import cast

_Entry = tuple[str, "re.Pattern[str] | None", type[Warning], None, int]
_lock = threading.Lock()
_holders: Counter[_Entry] = Counter()


@contextlib.contextmanager
def ignoring(category: type[Warning], message: str = "") -> Iterator[None]:
    """Warnings of `category` whose text starts with `message` (a regular expression, any
    case) are ignored inside the block."""
    entry: _Entry = ("ignore", re.compile(message, re.I) if message else None, category, None, 0)
    with _lock:
        if not _holders[entry]:
            warnings.filterwarnings("ignore", message, category)
        _holders[entry] += 1
    try:
        yield
    finally:
        with _lock:
            _holders[entry] -= 1
            if not _holders[entry]:
                del _holders[entry]
                # Gone already if a `catch_warnings` elsewhere put back a list without it.
                with contextlib.suppress(ValueError):
                    cast("list[_Entry]", warnings.filters).remove(entry)  # typeshed: a Sequence
