"""Keys are isolated (issue 27, item 6): what one key stores — responses kept for
`previous_response_id`, transcript sources — another key cannot read, nor tell from an
unknown id; a key with the admin scope reads everything. Stored responses also have a
byte budget, so one client cannot hold the server's memory with large conversations.

Before: any key continued any stored response it learnt the id of, every key's MCP tools
listed and read every source, and the response store was bounded by count alone (1024
conversations of up to a whole 16 MiB body each).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from modelpool.config.schema import AuthConfig
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL, STT_MODEL, TTS_MODEL, sdk, serving
from tests.e2e.mcp_helpers import call, mcp_client, mcp_config
from tests.live_server import live_server

KEYS = {"alice": ["inference"], "bob": ["inference"], "ops": ["admin", "inference"]}
SECRETS = {name: f"sk-isolation-{name}" for name in KEYS}


def keyring() -> KeyRing:
    holders = [{"name": name, "scopes": scopes, "key_env": f"ISOLATION_{name.upper()}"}
               for name, scopes in KEYS.items()]  # fmt: skip
    environ = {f"ISOLATION_{name.upper()}": secret for name, secret in SECRETS.items()}
    return KeyRing.from_config(AuthConfig.model_validate({"keys": holders}), environ)


def chat_only(**server: Any) -> dict[str, Any]:
    return {"server": server, "enabled_models": [CHAT_MODEL]}


async def continued(client: openai.AsyncOpenAI, previous: str | None, text: str = "What is my name?") -> Any:
    return await client.responses.create(
        model=CHAT_MODEL, input=text, max_output_tokens=2, temperature=0, previous_response_id=previous
    )


async def test_another_key_cannot_continue_a_stored_response() -> None:
    async with serving(chat_only(), keyring()) as (_, http):
        alice, bob, ops = (sdk(http, SECRETS[name]) for name in ("alice", "bob", "ops"))
        first = await continued(alice, None, "My name is Ada and I keep secrets.")
        refused = []
        for response_id in (first.id, "resp_" + "0" * 32):  # alice's, and one that never existed
            with pytest.raises(openai.NotFoundError) as caught:
                await continued(bob, response_id)
            refused.append(json.loads(json.dumps(caught.value.body).replace(response_id, "<id>")))
        assert refused[0] == refused[1], "another key's response must read as an unknown one"
        assert (refused[0]["code"], refused[0]["param"]) == ("previous_response_not_found", "previous_response_id")
        own, admin, fresh = await continued(alice, first.id), await continued(ops, first.id), await continued(bob, None)
        for action in (bob.responses.retrieve, bob.responses.delete):  # nor read or erase it by its id
            with pytest.raises(openai.NotFoundError) as caught:
                await action(first.id)
            body = caught.value.body
            assert isinstance(body, dict) and (body["code"], body["param"]) == ("not_found", "response_id")
            assert body["message"] == f"Response with id '{first.id}' not found."  # as for an id never made
        assert (await alice.responses.retrieve(first.id)).id == (await ops.responses.retrieve(first.id)).id
    assert own.usage.input_tokens == admin.usage.input_tokens > fresh.usage.input_tokens  # with alice's history


async def test_the_byte_budget_drops_the_oldest_stored_responses() -> None:
    budget = 6_000
    async with serving(chat_only(response_store_bytes=budget), keyring()) as (app, http):
        alice = sdk(http, SECRETS["alice"])
        ids = []
        for i in range(5):  # ~2 KB each as stored (two messages, the response as returned): two fit
            response = await continued(alice, None, f"{i}: " + "remember this. " * 10)
            ids.append(response.id)
            assert app.state.responses.bytes <= budget
        assert 2 <= len(app.state.responses) < 5
        with pytest.raises(openai.NotFoundError):
            await continued(alice, ids[0])
        fresh, newest = await continued(alice, None), await continued(alice, ids[-1])
    assert newest.usage.input_tokens > fresh.usage.input_tokens + 30  # the newest one's history is kept


async def test_another_key_cannot_read_a_transcript_source(tmp_path: Path) -> None:
    app = create_app(mcp_config(tmp_path, preload=False), keys=keyring())
    async with live_server(app) as url:
        async with mcp_client(url, SECRETS["alice"]) as alice:
            for source, text in (("room/1", "alice's secret plan"), ("alice/only", "alice's diary")):
                await call(alice, "add_transcript", source_id=source, text=text, start=0, end=1)
        await store_over_http(url, SECRETS["bob"], source="alice/only", start=100)  # bob's own alice/only
        async with mcp_client(url, SECRETS["bob"]) as bob:
            await call(bob, "add_transcript", source_id="room/1", text="bob was here", start=2, end=3)
            room = await entries(bob, source_id="room/1")
            probed, unknown = await entries(bob, source_id="alice/only"), await entries(bob, source_id="nobody")
            searched = await entries(bob, text="secret")
            listed = (await call(bob, "list_sources"))["sources"]
            stats = await call(bob, "get_transcript_stats")
        async with mcp_client(url, SECRETS["alice"]) as alice:
            diary = await entries(alice, source_id="alice/only")
        async with mcp_client(url, SECRETS["ops"]) as ops:
            everything = await entries(ops)
    assert [e["text"] for e in room] == ["bob was here"] and searched == [] and unknown == []
    assert probed and all(e["owner"] == "bob" and e["start"] >= 100 for e in probed)  # his upload, not her diary
    assert {(s["owner"], s["source_id"]) for s in listed} == {("bob", "room/1"), ("bob", "alice/only")}
    assert stats["entries"] == 1 + len(probed)
    assert [e["text"] for e in diary] == ["alice's diary"]  # bob's upload did not land in alice's source
    assert {e["owner"] for e in everything} == {"alice", "bob"}
    assert {e["text"] for e in everything} >= {"alice's secret plan", "alice's diary", "bob was here"}


async def entries(client: Any, **query: Any) -> list[dict[str, Any]]:
    return list((await call(client, "query_transcripts", **query))["entries"])


async def store_over_http(url: str, key: str, source: str, start: float) -> None:
    """A transcription whose segments go to `source` of `key`'s (speech made by the TTS model)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        speech = await http.post("/v1/audio/speech", json={"model": TTS_MODEL, "input": "Good morning everyone.",
                                                           "response_format": "wav"})  # fmt: skip
        assert speech.status_code == 200, speech.text
        form = {"model": STT_MODEL, "transcript_source": source, "transcript_start": str(start)}
        response = await http.post("/v1/audio/transcriptions", data=form, files={"file": ("a.wav", speech.content)})
        assert response.status_code == 200, response.text
