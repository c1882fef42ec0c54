"""A 16 MiB body of tiny list items (300,000 one-word messages) held the event loop over a
second while pydantic validated each item. Lists a client sends are capped, and pydantic
checks a list's length before its items, so such a body is refused at the cost of parsing
its JSON — on every protocol's route."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.config import load_config
from modelpool.server.app import create_app
from modelpool.wire.common import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_STOP_SEQUENCES

TOO_MANY = 300_000
LOOP_HELD_AT_MOST_S = 0.6
"""Parsing ~10 MB of JSON takes ~0.1 s here; validating the 300,000 items took 1.2 s. Counted
as this thread's CPU time (the event loop's, which runs the whole request in process), not
wall time: on a loaded machine the wall clock also counts the time other processes ran."""


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = load_config(None, cli={"starter_models": False}, environ={})
    app = create_app(config)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http


def body(route: str, items: int) -> bytes:
    turn = {"role": "user", "content": "hi"}
    if route == "/v1/responses":
        return json.dumps({"model": "x", "input": [turn] * items}).encode()
    if route == "/v1/messages":
        return json.dumps({"model": "x", "max_tokens": 5, "messages": [turn] * items}).encode()
    return json.dumps({"model": "x", "messages": [turn] * items}).encode()


async def refused_quickly(client: httpx.AsyncClient, route: str, payload: bytes) -> httpx.Response:
    """The 400 `payload` gets, having held this thread (the server's event loop) less than
    LOOP_HELD_AT_MOST_S of CPU."""
    started = time.thread_time()
    response = await client.post(route, content=payload, headers={"content-type": "application/json"})
    took = time.thread_time() - started
    assert response.status_code == 400, response.text
    assert took < LOOP_HELD_AT_MOST_S
    return response


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/tokenize"])
async def test_a_body_of_too_many_messages_is_refused_before_its_items_are_validated(
    client: httpx.AsyncClient, route: str
) -> None:
    response = await refused_quickly(client, route, body(route, TOO_MANY))
    assert f"at most {MAX_MESSAGES} items" in response.text


async def test_a_flat_content_array_of_too_many_parts_is_refused_fast(client: httpx.AsyncClient) -> None:
    """llm-pool's flat `input` (parts of one user message) is capped as a message's parts are."""
    payload = json.dumps({"model": "x", "input": [{"type": "text", "text": "a"}] * TOO_MANY}).encode()
    response = await refused_quickly(client, "/v1/responses", payload)
    assert "at most" in response.text and response.json()["error"]["param"] == "input"


async def test_one_message_of_too_many_parts_is_refused(client: httpx.AsyncClient) -> None:
    parts = [{"type": "text", "text": "a"}] * (MAX_CONTENT_PARTS + 1)
    payload = {"model": "x", "messages": [{"role": "user", "content": parts}]}
    response = await client.post("/v1/chat/completions", json=payload)
    assert response.status_code == 400
    assert f"at most {MAX_CONTENT_PARTS} items" in response.text


async def test_a_conversation_at_the_cap_is_taken(client: httpx.AsyncClient) -> None:
    payload = body("/v1/chat/completions", MAX_MESSAGES)
    response = await client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
    assert response.status_code == 404  # validated whole, then: no model of that name


def stop_body(route: str, stops: list[str]) -> dict[str, object]:
    turn = {"role": "user", "content": "hi"}
    if route == "/v1/responses":
        return {"model": "x", "input": "hi", "decoding": {"stop": stops}}
    if route == "/v1/messages":
        return {"model": "x", "max_tokens": 5, "messages": [turn], "stop_sequences": stops}
    return {"model": "x", "messages": [turn], "stop": stops}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
async def test_too_many_stop_sequences_are_refused_before_they_are_validated(
    client: httpx.AsyncClient, route: str
) -> None:
    """Each stop sequence is also scanned at every generated token, on the engine's thread."""
    response = await refused_quickly(client, route, json.dumps(stop_body(route, ["q"] * TOO_MANY)).encode())
    assert f"at most {MAX_STOP_SEQUENCES} items" in response.text


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
async def test_an_empty_stop_sequence_is_refused(client: httpx.AsyncClient, route: str) -> None:
    response = await client.post(route, json=stop_body(route, ["ok", ""]))
    assert response.status_code == 400, response.text
    assert "stop sequences must not be empty" in response.text


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
async def test_a_top_k_past_what_engines_take_is_a_400(client: httpx.AsyncClient, route: str) -> None:
    body = stop_body(route, ["."])
    if route == "/v1/responses":
        body["decoding"] = {"top_k": 2**64}
    else:
        body["top_k"] = 2**64
    response = await client.post(route, json=body)
    assert response.status_code == 400, response.text
    assert "top_k" in response.text
