"""Live configuration against a real `modelpool serve` process and real models: the config
file in a tmp dir rewritten, then SIGHUP or `POST /v1/admin/reload` (the file watch and keys
are tested in-process: tests/server/test_reload.py). One server for every step, in order."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import CHAT_MODEL, EMBED_MODEL
from tests.polling import wait_until
from tests.processes import Server, modelpool_serve


def write(path: Path, enabled: list[str], chat_options: dict[str, Any] | None = None) -> None:
    models = {CHAT_MODEL: {"options": chat_options}} if chat_options else {}
    path.write_text(yaml.safe_dump({"enabled_models": enabled, "pool": {"reap_interval_s": 0.1}, "models": models}))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    folder = tmp_path_factory.mktemp("reload")
    path = folder / "models.yaml"
    write(path, [CHAT_MODEL])
    with modelpool_serve(folder / "server.log", "--config", str(path), "--log-format", "json") as served:
        yield served, path


def ids(client: openai.OpenAI) -> set[str]:
    return {model.id for model in client.models.list().data}


def test_add_change_remove_and_refuse_with_the_official_sdk(server: tuple[Server, Path]) -> None:
    served, path = server
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    assert ids(client) == {CHAT_MODEL}

    write(path, [CHAT_MODEL, EMBED_MODEL])  # added: on SIGHUP, logged
    served.process.send_signal(signal.SIGHUP)
    wait_until(lambda: EMBED_MODEL in ids(client), "the added model to be listed", timeout_s=60)
    assert len(client.embeddings.create(model=EMBED_MODEL, input="hello").data[0].embedding) == 384
    wait_until(lambda: any(line.get("message") == "config reloaded" and line.get("trigger") == "sighup"
                           for line in served.log_lines()), "the SIGHUP reload's log line")  # fmt: skip

    # changed: a stream in flight finishes on the loaded engine, then the model reloads with the new options
    stream = client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Count to 20"}],
                                            max_tokens=32, temperature=0, stream=True)  # fmt: skip
    first = next(iter(stream))
    write(path, [CHAT_MODEL, EMBED_MODEL], chat_options={"n_ctx": 1536})
    diff = httpx.post(f"{served.url}/v1/admin/reload", timeout=60).json()
    assert diff["reloading"] == [{"id": CHAT_MODEL, "fields": ["options"]}] and diff["unchanged"] == 1
    finished = [chunk.choices[0].finish_reason for chunk in stream if chunk.choices]
    assert first.choices and finished[-1] in ("stop", "length")

    def reloaded() -> bool:
        status = httpx.get(f"{served.url}/v1/admin/models/{CHAT_MODEL}/status", timeout=10).json()
        return bool(status["options"].get("n_ctx") == 1536 and status["state"] == "ready")

    wait_until(reloaded, "the changed model to load with its new options", timeout_s=120)
    reply = client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.choices[0].message.content

    write(path, [CHAT_MODEL])  # removed
    assert httpx.post(f"{served.url}/v1/admin/reload", timeout=60).json()["removed"] == [EMBED_MODEL]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=EMBED_MODEL, input="hello")

    path.write_text("enabled_models: [no-such-model]\n")  # invalid: nothing changes
    refused = httpx.post(f"{served.url}/v1/admin/reload", timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_config" and "no-such-model" in error["message"], json.dumps(error)
    assert ids(client) == {CHAT_MODEL}
    assert client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4).choices[0].message.content  # fmt: skip
