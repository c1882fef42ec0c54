"""Engine-independent pieces of turning tokens into streamed text.

`Utf8Stream` holds back the bytes of a character split across tokens. `StopMatcher`
holds back text that might be the start of a stop sequence, so a stop sequence never
leaks into the output, even when it arrives split across tokens.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from modelpool.errors import ContextLengthExceeded, InvalidRequest
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob


class Utf8Stream:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    matched: str | None = field(default=None, init=False)
    """The stop sequence found (the earliest in the text; the first listed on a tie)."""
    _held: str = field(default="", init=False)

    def feed(self, text: str, *, armed: bool = True) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop sequence was found). After a stop, the
        text from the stop sequence on is dropped. Not `armed` (before `min_tokens`), the
        text passes unchecked: a stop sequence there does not count."""
        if not armed:
            held, self._held = self._held, ""
            return held + text, False
        if not self.stops:
            return text, False
        buffer = self._held + text
        found = [(at, stop) for stop in self.stops if (at := buffer.find(stop)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda hit: hit[0])
            self._held = ""
            return buffer[:cut], True
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, once generation ended without a stop."""
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that is the beginning of some stop sequence."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best


def may_end(sampling: SamplingParams, generated: int) -> bool:
    """Whether end-of-sequence may end a generation that has `generated` tokens so far;
    engines mask the end-of-sequence tokens' logits while it may not."""
    return not sampling.ignore_eos and generated >= sampling.min_tokens


def tokens_to_generate(prompt_tokens: int, max_tokens: int | None, limit: int, param: str) -> int:
    """How many tokens a request may generate within the model's `limit`; a prompt that
    does not fit, or a `max_tokens` past the room left, is a 400 naming the numbers."""
    room = limit - prompt_tokens
    if room <= 0:
        raise ContextLengthExceeded(
            f"the prompt is {prompt_tokens} tokens; this model takes at most {limit}", param=param
        )
    if max_tokens is not None and max_tokens > room:
        raise ContextLengthExceeded(
            f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds this model's "
            f"limit of {limit} tokens; ask for at most {room} tokens",
            param="max_tokens",
        )
    return room if max_tokens is None else max_tokens


def check_token_ids(ids: Sequence[int], vocabulary_size: int, param: str) -> list[int]:
    """A prompt given as token ids must hold ids of the model's vocabulary: a 400 naming
    the first that is not."""
    bad = next((t for t in ids if not 0 <= t < vocabulary_size), None)
    if bad is not None:
        raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{vocabulary_size - 1})", param=param)
    return list(ids)


def start_of_text(bos: int | None, param: str = "prompt") -> list[int]:
    """An empty prompt means "from the start": the BOS token, as OpenAI's API treats it."""
    if bos is None or bos < 0:
        raise InvalidRequest("the prompt is empty and this model has no start-of-text token", param=param)
    return [bos]


async def with_echo(
    chunks: AsyncIterator[GenerationChunk], text: str, logprobs: tuple[TokenLogprob, ...]
) -> AsyncGenerator[GenerationChunk, None]:
    """The prompt (and its scored tokens) put in front of the first chunk (`echo: true`)."""
    first = True
    async for chunk in chunks:
        if first:
            chunk = replace(chunk, text=text + chunk.text, logprobs=logprobs + chunk.logprobs)
            first = False
        yield chunk
