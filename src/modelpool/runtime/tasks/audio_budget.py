"""One budget of decoded audio for the whole server.

`server.max_audio_seconds` bounds one request, but a decoded upload is held until its
transcription ends, and every model queues up to `max_queue` requests: 64 uploads of two
hours of (very compressible) audio would hold 29 GB of samples at 16 kHz. So the seconds
of audio held decoded at once, by all requests together, are a budget: a request takes its
share after counting its length and before keeping a sample, and gives it back when its
transcript stream closes. A request that cannot get its share within the pool's wait is
refused with 429 `overloaded`, never queued without end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from modelpool.errors import Overloaded


class AudioBudget:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.held_s = 0.0
        self._changed = asyncio.Event()

    async def take(self, seconds: float, wait_s: float) -> Callable[[], None]:
        """Hold `seconds` of the budget (waiting up to `wait_s` for others to give theirs
        back); returns the release, which may be called any number of times."""
        if seconds > self.total_s:  # the config keeps max_audio_seconds within the budget
            raise Overloaded(f"{seconds:.0f} s of audio exceed the server's decode budget", retry_after_s=wait_s)
        deadline = asyncio.get_running_loop().time() + wait_s
        # The check and the taking happen in this task with no await between them: two
        # waiters woken by one release cannot both see the same room.
        while self.held_s + seconds > self.total_s:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise Overloaded(
                    "the server holds as much decoded audio as it may (server.audio_budget_seconds); retry shortly",
                    retry_after_s=max(1.0, wait_s),
                )
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        self.held_s += seconds
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.held_s -= seconds
                self._changed.set()

        return release
