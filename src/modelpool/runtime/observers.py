"""How a request's timing and use reach the metrics (and, through them, the caller's usage):
shared by the pool in one process and the Ray ingress, which observes what replicas send."""

from __future__ import annotations

from collections.abc import Callable

from modelpool.inference import GenerationChunk
from modelpool.runtime.clock import Clock
from modelpool.runtime.generation import chunk_timer
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.timing import RequestTiming


class RequestObservers:
    def __init__(self, metrics: Metrics, clock: Clock) -> None:
        self.metrics = metrics
        self.clock = clock

    def chunks(self, model_id: str, timing: RequestTiming) -> Callable[[GenerationChunk], None]:
        """Times one generation at a time into `timing`, counting its tokens as they pass."""
        return chunk_timer(timing, self.clock, lambda: self.metrics.count_timing(model_id, timing))

    def finished(self, model_id: str) -> Callable[[RequestTiming], None]:
        """For a request's end: its time on the backend, and whatever tokens are not counted yet."""

        def done(timing: RequestTiming) -> None:
            timing.backend_s = self.clock.monotonic() - timing.started
            self.metrics.observe_timing(model_id, timing)

        return done

    def audio(self, model_id: str, task: str, audio_seconds: Callable[[], float]) -> Callable[[RequestTiming], None]:
        """For an audio request's end: the seconds of audio heard or spoken, and the real-time factor."""

        def done(timing: RequestTiming) -> None:
            timing.backend_s = self.clock.monotonic() - timing.started
            self.metrics.observe_audio(model_id, task, audio_seconds(), timing.backend_s)

        return done
