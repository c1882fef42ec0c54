"""How a request's timing and use reach the metrics and the usage returned with its result:
shared by the pool in one process and the Ray ingress, which observes what replicas send."""

from __future__ import annotations

from collections.abc import Callable

from modelpool.inference import GenerationChunk
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.clock import Clock
from modelpool.runtime.metrics.prometheus import Metrics


class RequestObservers:
    """Each request's observers feed the pool's metrics and the request's own `RequestUsage`
    (returned with its result) from the same counts, so the two never disagree."""

    def __init__(self, metrics: Metrics, clock: Clock) -> None:
        self.metrics = metrics
        self.clock = clock

    def chunks(self, model_id: str, timing: RequestTiming, usage: RequestUsage) -> Callable[[GenerationChunk], None]:
        """Times one generation at a time into `timing`, counting its tokens as they pass."""
        return chunk_timer(timing, self.clock, lambda: self.count(model_id, timing, usage))

    def count(self, model_id: str, timing: RequestTiming, usage: RequestUsage) -> None:
        """Count the tokens `timing` gained since it was last counted, into the metrics and `usage`."""
        self.metrics.count_timing(model_id, timing)
        _sync(timing, usage)

    def ended(self, model_id: str, timing: RequestTiming, usage: RequestUsage) -> None:
        """A request's turn ended: its times, and whatever tokens are not counted yet."""
        self.metrics.observe_timing(model_id, timing)
        _sync(timing, usage)

    def finished(self, model_id: str, usage: RequestUsage) -> Callable[[RequestTiming], None]:
        """For a request's end: its time on the backend, and whatever tokens are not counted yet."""

        def done(timing: RequestTiming) -> None:
            timing.backend_s = self.clock.monotonic() - timing.started
            self.ended(model_id, timing, usage)

        return done

    def audio(
        self, model_id: str, task: str, audio_seconds: Callable[[], float], usage: RequestUsage
    ) -> Callable[[RequestTiming], None]:
        """For an audio request's end: the seconds of audio heard or spoken, and the real-time factor."""

        def done(timing: RequestTiming) -> None:
            timing.backend_s = self.clock.monotonic() - timing.started
            seconds = audio_seconds()
            self.metrics.observe_audio(model_id, task, seconds, timing.backend_s)
            if task == "transcription":
                usage.audio_seconds_in += seconds
            else:
                usage.audio_seconds_out += seconds

        return done


def _sync(timing: RequestTiming, usage: RequestUsage) -> None:
    """A request's token usage is what the metrics have counted of its timing (counts only grow)."""
    usage.input_tokens = timing.counted_prompt_tokens
    usage.output_tokens = timing.counted_output_tokens


def chunk_timer(
    timing: RequestTiming, clock: Clock, counted: Callable[[], None] | None = None
) -> Callable[[GenerationChunk], None]:
    """Feeds `timing` from the chunks of one generation at a time as they pass: time to
    first token, and token counts (summed over the generations of a multi-prompt request)
    as soon as they are known: the prompt's from the chunk that says it (a local engine's
    first, at admission), the output's chunk by chunk (`token_count`), both set right by the
    generation's last chunk (its `usage`, the count to rely on). `counted()` runs after
    each change, so a generation cut off midway (a client that hung up, a cancelled
    request) has its tokens so far counted. Concurrent generations need a timer each."""
    prompt_seen = output_seen = 0  # of the generation in progress, before its usage came

    def observe(chunk: GenerationChunk) -> None:
        nonlocal prompt_seen, output_seen
        if (chunk.text or chunk.tool_calls) and timing.time_to_first_token_s is None:
            timing.time_to_first_token_s = clock.monotonic() - timing.started
        if chunk.prompt_seconds is not None:  # summed over the prompts of a multi-prompt request
            timing.tokenize_s = (timing.tokenize_s or 0.0) + chunk.prompt_seconds
        if chunk.speculation is not None:  # the last chunk of a generation a draft model sped up
            timing.count_drafts(chunk.speculation.drafted, chunk.speculation.accepted)
        if chunk.usage is not None:  # the generation's own count replaces what its chunks said
            more_prompt = chunk.usage.prompt_tokens - prompt_seen
            more_output = chunk.usage.completion_tokens - output_seen
            prompt_seen = output_seen = 0  # the next generation (multi-prompt) starts afresh
        else:
            more_prompt = chunk.prompt_tokens if chunk.prompt_tokens and not prompt_seen else 0
            more_output = chunk.token_count
            prompt_seen += more_prompt
            output_seen += more_output
        if more_prompt or more_output:
            timing.prompt_tokens += more_prompt
            timing.output_tokens += more_output
            if counted is not None:
                counted()

    return observe
