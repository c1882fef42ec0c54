"""A check shared by the engines' tests: a stop string that spans two tokens never leaks."""

from __future__ import annotations

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam


async def assert_stop_across_tokens_never_leaks(oai: openai.AsyncOpenAI, model: str) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Describe the ocean in two sentences."}]
    free = await oai.chat.completions.create(
        model=model, messages=messages, max_tokens=30, temperature=0, logprobs=True
    )
    assert free.choices[0].logprobs is not None
    assert free.choices[0].logprobs.content is not None
    tokens = [t.token for t in free.choices[0].logprobs.content]
    # A stop string made of the end of one multi-character token and the start of the next.
    boundary = next(i for i in range(1, len(tokens)) if len(tokens[i - 1]) >= 2 and len(tokens[i]) >= 2)
    stop = tokens[boundary - 1][-2:] + tokens[boundary][:2]
    text = free.choices[0].message.content
    for streamed in (False, True):
        reply = await oai.chat.completions.create(
            model=model, messages=messages, max_tokens=30, temperature=0, stop=stop, stream=streamed
        )
        got: str | None
        if streamed:
            assert isinstance(reply, openai.AsyncStream)
            got = "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
        else:
            assert isinstance(reply, ChatCompletion)
            got = reply.choices[0].message.content
        assert text is not None
        assert got == text[: text.index(stop)]
        assert stop not in got
