"""`llama_server` models: llama-cpp-python's own server (`python -m llama_cpp.server`) on the
SmolLM2 GGUF as a managed engine process, driven through the official openai SDK."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from modelpool.services.pids import is_alive
from modelpool.services.process import terminate_group
from modelpool.services.registry import Registry
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.processes import modelpool_serve

ENGINE = "smollm2-engine"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


def engine_config(state_dir: Path, **settings: Any) -> dict[str, Any]:
    options = settings.pop("options", {})
    model = {
        "backend": "llama_server",
        "source": str(smollm2_gguf()),
        "restart_backoff_s": 0.2,
        "options": {"context_length": 2048, "stop_grace_s": 5, **options},
        **settings,
    }
    return {"enabled_models": [ENGINE], "state_dir": str(state_dir), "models": {ENGINE: model}}


async def status(client: httpx.AsyncClient) -> dict:
    response = await client.get(f"/v1/admin/models/{ENGINE}/status")
    assert response.status_code == 200
    return response.json()


async def loaded(client: httpx.AsyncClient) -> dict:
    """The model's status once loaded (preloading runs in the background of a fresh app)."""
    response = await client.post(f"/v1/admin/models/{ENGINE}/load")
    assert response.status_code == 200, response.text
    return response.json()


async def wait_state(client: httpx.AsyncClient, state: str, timeout_s: float = 10) -> dict:
    async with asyncio.timeout(timeout_s):
        while (current := await status(client))["state"] != state:
            await asyncio.sleep(0.05)
    return current


async def test_chat_completions_and_logs_through_the_engine_process(tmp_path: Path) -> None:
    async with serving(engine_config(tmp_path)) as (_, client):
        oai = sdk(client)
        # min_tokens (forwarded; llama_cpp.server knows it): 8 tokens whatever greedy says here.
        reply = await oai.chat.completions.create(
            model=ENGINE, messages=HI, max_tokens=8, temperature=0, extra_body={"min_tokens": 8}
        )
        assert reply.choices[0].message.content and reply.model == ENGINE
        assert reply.usage is not None and reply.usage.completion_tokens == 8 and reply.usage.prompt_tokens > 8
        stream = await oai.chat.completions.create(
            model=ENGINE, messages=HI, max_tokens=8, temperature=0, stream=True, extra_body={"min_tokens": 8}
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert streamed == reply.choices[0].message.content  # greedy: the same text either way
        completion = await oai.completions.create(model=ENGINE, prompt="The capital of France is", max_tokens=3,
                                                  temperature=0, logprobs=2)  # fmt: skip
        assert completion.choices[0].text.strip().startswith("Paris")
        logprobs = completion.choices[0].logprobs
        assert logprobs is not None and len(logprobs.tokens or []) == 3 and len(logprobs.top_logprobs or []) == 3

        engine = (await status(client))["replicas"][0]
        process = psutil.Process(engine["pid"])
        assert "llama_cpp.server" in process.cmdline() and process.ppid() == os.getpid()
        assert engine["memory_bytes"] > 50 * 1024 * 1024  # the engine's own RSS, not ours
        logs = (await client.get(f"/v1/admin/models/{ENGINE}/logs", params={"lines": 50})).json()
        assert logs["processes"][0]["pid"] == engine["pid"]
        assert any("POST /v1/chat/completions" in line for line in logs["processes"][0]["lines"])

        unloaded = await client.post(f"/v1/admin/models/{ENGINE}/unload")
        assert unloaded.json()["state"] == "unloaded"
        assert not is_alive(engine["pid"])  # unload stops the process, and its memory goes with it


def test_a_killed_engine_fails_the_stream_then_restarts_on_the_next_request(tmp_path: Path) -> None:
    # A real modelpool server: httpx's in-process transport would buffer the whole stream.
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({"starter_models": False, **engine_config(tmp_path)}))
    with modelpool_serve(tmp_path / "server.log", "-c", str(config_file)) as server:
        admin = httpx.Client(base_url=server.url, timeout=60)
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        first_pid = admin.get(f"/v1/admin/models/{ENGINE}/status").json()["replicas"][0]["pid"]
        stream = oai.chat.completions.create(
            model=ENGINE, messages=[{"role": "user", "content": "Tell a long story."}], max_tokens=400, stream=True
        )
        received = []
        with pytest.raises(openai.APIError, match="went away mid-response"):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
                    if len(received) == 3:
                        os.kill(first_pid, signal.SIGKILL)  # mid-stream, once text flows
        assert len(received) < 100  # cut short, not finished first

        deadline = time.monotonic() + 10
        while (failed := admin.get(f"/v1/admin/models/{ENGINE}/status").json())["state"] != "failed":
            assert time.monotonic() < deadline, failed  # the exit is noticed a moment after the broken stream
            time.sleep(0.05)
        assert failed["crashes_in_a_row"] == 1
        assert "killed by signal 9" in failed["last_error"]
        crash = admin.get(f"/v1/admin/models/{ENGINE}/logs").json()["last_crash"]
        assert crash["lines"] and "killed by signal 9" in crash["error"]

        reply = oai.chat.completions.create(model=ENGINE, messages=HI, max_tokens=4, extra_body={"min_tokens": 1})
        assert reply.choices[0].message.content  # min_tokens: sampled, it might otherwise end at once
        restarted = admin.get(f"/v1/admin/models/{ENGINE}/status").json()
        assert restarted["state"] == "ready" and restarted["replicas"][0]["pid"] != first_pid


async def test_a_crash_loop_stops_restarting_and_says_so(tmp_path: Path) -> None:
    async with serving(engine_config(tmp_path, max_restarts=1, preload=False)) as (_, client):
        oai = sdk(client)
        for _ in range(2):
            await oai.chat.completions.create(model=ENGINE, messages=HI, max_tokens=2)
            os.kill((await status(client))["replicas"][0]["pid"], signal.SIGKILL)
            await wait_state(client, "failed")
        refused = await client.post("/v1/chat/completions", json={"model": ENGINE, "messages": HI, "max_tokens": 2})
        assert refused.status_code == 503
        assert "crashed 2 times in a row" in refused.json()["error"]["message"]
        assert (await client.post(f"/v1/admin/models/{ENGINE}/load")).json()["state"] == "ready"  # explicit: retry


async def test_replicas_are_separate_processes_on_separate_ports(tmp_path: Path) -> None:
    async with serving(engine_config(tmp_path, replicas=2)) as (_, client):
        replicas = (await loaded(client))["replicas"]
        assert len({r["pid"] for r in replicas}) == 2 and len({r["port"] for r in replicas}) == 2
        oai = sdk(client)
        replies = await asyncio.gather(
            *(
                oai.chat.completions.create(
                    model=ENGINE, messages=HI, max_tokens=4, temperature=0, extra_body={"min_tokens": 4}
                )
                for _ in range(4)
            )
        )
        # All whole: llama_cpp.server's default would let a new request cut off the one running
        # (min_tokens: only the cap may end them, whatever greedy says on this machine).
        assert all(r.choices[0].finish_reason == "length" for r in replies), [r.choices[0] for r in replies]
        served = [r["served"] for r in (await status(client))["replicas"]]
        assert sum(served) == 4 and all(s > 0 for s in served)  # the least busy replica gets each request


@pytest.fixture
def no_engines_left(tmp_path: Path) -> Iterator[None]:
    """Persistent engines outlive modelpool by design: a failing test must not leave one behind."""
    yield
    for record in Registry(tmp_path).records():
        asyncio.run(terminate_group(record.pid, 5))


@pytest.mark.usefixtures("no_engines_left")
async def test_a_persistent_engine_survives_a_restart_and_is_adopted_not_duplicated(tmp_path: Path) -> None:
    config = engine_config(tmp_path, options={"persistent": True})
    async with serving(config) as (_, client):
        first = (await loaded(client))["replicas"][0]
    assert is_alive(first["pid"])  # modelpool stopped; the engine did not

    async with serving(config) as (_, client):
        adopted = (await loaded(client))["replicas"][0]
        assert (adopted["pid"], adopted["port"]) == (first["pid"], first["port"])
        reply = await sdk(client).chat.completions.create(model=ENGINE, messages=HI, max_tokens=4)
        assert reply.choices[0].message.content
        engines = [p.pid for p in psutil.Process().children(recursive=True) if "llama_cpp.server" in p.cmdline()]
        assert engines == [first["pid"]]  # the one the first modelpool started (in this test process): no second
    assert is_alive(first["pid"])

    stop = [sys.executable, "-m", "modelpool", "stop-persistent", "--state-dir", str(tmp_path), "--grace", "5"]
    done = subprocess.run(stop, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and ENGINE in done.stdout and "terminated" in done.stdout
    assert not is_alive(first["pid"]) and Registry(tmp_path).records() == []
    again = subprocess.run(stop, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == ""  # nothing running: skipped silently


async def test_prompt_lookup_decoding_keeps_greedy_output(tmp_path: Path) -> None:
    """llama_cpp.server's speculative decoding (`prompt_lookup_tokens`: drafts from the
    context, verified by the model) gives the greedy text it gives without; set as a
    load-time override, which restarts the engine with the flags."""
    text = "The quick brown fox jumps over the lazy dog."
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"Repeat this sentence twice: {text}"}]
    async with serving(engine_config(tmp_path)) as (_, client):
        oai = sdk(client)
        answers = []
        for overrides in ({}, {"prompt_lookup_tokens": 8}):
            loaded_now = await client.post(f"/v1/admin/models/{ENGINE}/load", json={"overrides": overrides})
            assert loaded_now.status_code == 200, loaded_now.text
            reply = await oai.chat.completions.create(model=ENGINE, messages=ask, max_tokens=16, temperature=0)
            answers.append(reply.choices[0].message.content)
            argv = psutil.Process(loaded_now.json()["replicas"][0]["pid"]).cmdline()
            assert ("prompt-lookup-decoding" in argv) == bool(overrides)
        assert answers[0] and answers[1] == answers[0]
