"""OpenAI's Files and Batches APIs with the official SDK, on the real starter models: a
batch's output equals what the route answers for the same requests, embeddings too; a
wrong line fails the batch naming it; cancel stops it mid-way; a restart resumes it
without running a done line again; another key sees neither file nor batch; bad uploads
and ids get the 4xx they should."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from modelpool.config.schema import AuthConfig
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL, EMBED_MODEL, sdk, serving
from tests.polling import until_answered

SECRETS = {"ALICE": "sk-alice", "BOB": "sk-bob", "OPS": "sk-ops"}
ALICE = {"Authorization": "Bearer sk-alice"}
GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 1, "max_tokens": 8}
CHAT_URL = "/v1/chat/completions"
ASK: Any = [{"role": "user", "content": "x"}]
QUESTIONS = ["Name a colour.", "Say hello.", "Count to three.", "Name a fruit."]


def keyed_config(directory: Path, **batch_api: Any) -> tuple[dict[str, Any], KeyRing]:
    keys = [{"name": "alice", "key_env": "ALICE", "scopes": ["inference"]},
            {"name": "bob", "key_env": "BOB", "scopes": ["inference"]},
            {"name": "ops", "key_env": "OPS", "scopes": ["admin", "inference"]}]  # fmt: skip
    auth = {"keys": keys}
    cli = {"enabled_models": [CHAT_MODEL, EMBED_MODEL], "auth": auth,
           "batch_api": {"dir": str(directory), "concurrency": 1, **batch_api}}  # fmt: skip
    return cli, KeyRing.from_config(AuthConfig.model_validate(auth), SECRETS)


@contextlib.asynccontextmanager
async def batch_server(directory: Path, **batch_api: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    cli, keys = keyed_config(directory, **batch_api)
    async with serving(cli, keys=keys) as served:
        yield served


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with batch_server(tmp_path_factory.mktemp("batches")) as served:
        yield served


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_lines(questions: list[str], url: str = "/v1/chat/completions") -> list[dict[str, Any]]:
    return [{"custom_id": f"q{i}", "method": "POST", "url": url,
             "body": {"model": CHAT_MODEL, "messages": [{"role": "user", "content": q}], **GREEDY}}
            for i, q in enumerate(questions)]  # fmt: skip


async def finished(client: openai.AsyncOpenAI, batch_id: str, timeout_s: float = 120) -> Any:
    ended = ("completed", "failed", "cancelled", "expired")
    batch: Any = None

    async def done() -> bool:
        nonlocal batch
        batch = await client.batches.retrieve(batch_id)
        return batch.status in ended

    await until_answered(done, f"batch {batch_id} to end", timeout_s=timeout_s)
    return batch


async def submit(
    client: openai.AsyncOpenAI, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions"
) -> Any:
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return await client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


async def output_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def test_a_chat_batch_answers_what_the_route_answers(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice = sdk(http, "sk-alice")
    batch = await submit(alice, chat_lines(QUESTIONS[:3]))
    assert batch.status == "validating" and batch.request_counts is not None and batch.request_counts.total == 3
    batch = await finished(alice, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 0)
    assert batch.model == CHAT_MODEL and batch.in_progress_at and batch.completed_at and batch.error_file_id is None
    assert batch.usage is not None and batch.usage.total_tokens > 0
    lines = await output_lines(alice, batch.output_file_id)
    assert [line["custom_id"] for line in lines] == ["q0", "q1", "q2"]
    for line, question in zip(lines, QUESTIONS, strict=False):
        raw = await alice.chat.completions.with_raw_response.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": question}], **GREEDY
        )
        direct = raw.http_response.json()
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"] and line["error"] is None
        assert response["body"]["choices"] == direct["choices"] and response["body"]["usage"] == direct["usage"]
    listed = await alice.batches.list()
    assert batch.id in [b.id for b in listed.data]
    output = await alice.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{batch.id}_output.jsonl"


async def test_an_embeddings_batch_and_a_line_the_model_refuses(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice = sdk(http, "sk-alice")
    texts = ["a red apple", "the sea"]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED_MODEL, "input": text}} for i, text in enumerate(texts)]  # fmt: skip
    lines.append({"custom_id": "missing", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "no-such-model", "input": "x"}})  # fmt: skip
    batch = await finished(alice, (await submit(alice, lines, "/v1/embeddings")).id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    outputs = await output_lines(alice, batch.output_file_id)
    for line, text in zip(outputs, texts, strict=True):
        direct = await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": text}, headers=ALICE)
        assert line["response"]["body"]["data"] == direct.json()["data"]
    errors = await output_lines(alice, batch.error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("missing", 404)]
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"


async def test_wrong_lines_fail_the_batch_before_anything_runs(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice = sdk(http, "sk-alice")
    lines = chat_lines(QUESTIONS[:2])
    lines.append({**lines[0]})  # the same custom_id again
    lines.append({**chat_lines(["x"])[0], "custom_id": "u", "url": "/v1/embeddings"})
    bad_body = chat_lines(["x"])[0]
    bad_body["custom_id"], bad_body["body"]["temperature"] = "t", 9
    lines.append(bad_body)
    batch = await finished(alice, (await submit(alice, lines)).id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors is not None
    found = [(e.line, e.code, e.param) for e in batch.errors.data or []]
    assert found == [(3, "duplicate_custom_id", "custom_id"), (4, "mismatched_url", "url"),
                     (5, "invalid_value", "body.temperature")]  # fmt: skip
    assert (await alice.batches.retrieve(batch.id)).request_counts.completed == 0  # type: ignore[union-attr]


async def test_cancel_stops_a_batch_mid_way(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice = sdk(http, "sk-alice")
    many = chat_lines([f"Tell a story about the number {i}." for i in range(30)])
    for line in many:
        line["body"]["max_tokens"] = 24
    batch = await submit(alice, many)

    async def started() -> bool:
        return (await alice.batches.retrieve(batch.id)).request_counts.completed >= 1  # type: ignore[union-attr]

    await until_answered(started, "the first line to finish", timeout_s=60)
    cancelling = await alice.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = await finished(alice, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    done = batch.request_counts.completed
    assert 1 <= done < 30
    assert len(await output_lines(alice, batch.output_file_id)) == done
    with pytest.raises(openai.BadRequestError, match="status is 'cancelled'"):
        await alice.batches.cancel(batch.id)


async def test_another_key_sees_neither_file_nor_batch(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice, bob, ops = sdk(http, "sk-alice"), sdk(http, "sk-bob"), sdk(http, "sk-ops")
    uploaded = await alice.files.create(file=("mine.jsonl", io.BytesIO(jsonl(chat_lines(["hi"])))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.filename == "mine.jsonl" and uploaded.bytes > 0
    with pytest.raises(openai.NotFoundError, match=f"No such File object: {uploaded.id}"):
        await bob.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await bob.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await bob.files.delete(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        await bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert uploaded.id not in [f.id for f in (await bob.files.list()).data]
    assert uploaded.id in [f.id for f in (await ops.files.list()).data]  # the admin scope sees all
    batch = await alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        await bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await bob.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in (await bob.batches.list()).data]
    await finished(alice, batch.id)
    deleted = await alice.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        await alice.files.retrieve(uploaded.id)


async def test_bad_uploads_and_ids(server: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = server
    alice = sdk(http, "sk-alice")
    headers = ALICE

    async def upload(data: bytes, purpose: str = "batch") -> httpx.Response:
        return await http.post("/v1/files", files={"file": ("f.jsonl", data)}, data={"purpose": purpose},
                               headers=headers)  # fmt: skip

    bad_purpose = await upload(jsonl(chat_lines(["x"])), "fine-tune")
    assert bad_purpose.status_code == 400 and bad_purpose.json()["error"]["param"] == "purpose"
    not_json = await upload(b'{"custom_id": "a"}\n{not json\n')
    assert not_json.status_code == 400 and "Line 2 is not valid JSON" in not_json.json()["error"]["message"]
    empty = await upload(b"\n\n")
    assert empty.status_code == 400 and "no requests" in empty.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        await alice.batches.create(input_file_id="file-x", endpoint="/v1/audio/speech", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await alice.batches.create(input_file_id="file-x", endpoint="/v1/embeddings", completion_window="1h")  # type: ignore[arg-type]
    for path in ("/v1/files/..%2F..%2Fetc%2Fpasswd", "/v1/files/a.b", "/v1/batches/..%2Fx"):
        answer = await http.get(path, headers=headers)
        assert answer.status_code in (400, 404) and "error" in answer.json(), (path, answer.text)
    assert (await http.get("/v1/files/file-0123456789abcdef01234567", headers=headers)).status_code == 404
    assert (await http.get("/v1/files?limit=0", headers=headers)).status_code == 400
    methods = {"/v1/files": "GET, POST", "/v1/files/file-x": "DELETE, GET", "/v1/batches": "GET, POST"}
    for path, allowed in methods.items():
        refused = await http.request("PUT", path, headers=headers)  # a 405 lists every method of the path
        assert (refused.status_code, refused.headers["allow"]) == (405, allowed)
    assert (await http.get("/v1/batches?limit=101", headers=headers)).status_code == 400


async def test_upload_bounds(tmp_path: Path) -> None:
    async with batch_server(tmp_path, max_file_bytes=4096, max_lines=3, max_line_bytes=512, key_storage_bytes=6000) as (
        _,
        http,
    ):
        headers = ALICE

        async def upload(data: bytes) -> httpx.Response:
            return await http.post("/v1/files", files={"file": ("f.jsonl", data)}, data={"purpose": "batch"},
                                   headers=headers)  # fmt: skip

        line = jsonl(chat_lines(["x"]))
        assert (await upload(line * 4)).json()["error"]["message"].startswith("The file has more than 3 requests")
        long_line = await upload(line + b'{"pad": "' + b"x" * 600 + b'"}\n')
        assert (
            long_line.status_code == 400 and "Line 2 is longer than 512 bytes" in long_line.json()["error"]["message"]
        )
        oversize = await upload(b"\n" * 5000)
        assert oversize.status_code == 413, oversize.text
        kept = [await upload(line * 3) for _ in range(20)]
        assert kept[0].status_code == 200 and kept[-1].status_code == 413
        assert kept[-1].json()["error"]["code"] == "store_full"


async def test_a_restart_resumes_a_batch_without_rerunning_done_lines(tmp_path: Path) -> None:
    lines = chat_lines([f"Write about the number {i}." for i in range(8)])
    async with batch_server(tmp_path) as (app, http):
        alice = sdk(http, "sk-alice")
        batch = await submit(alice, lines)

        async def two_done() -> bool:
            return (await alice.batches.retrieve(batch.id)).request_counts.completed >= 2  # type: ignore[union-attr]

        await until_answered(two_done, "two lines to finish", timeout_s=60)
    done_before = done_in_sqlite(tmp_path / "batches.sqlite", batch.id)
    ran_before = app.state.usage.totals()["alice"].requests - 2  # the upload and the create
    assert ran_before in (done_before, done_before + 1)  # + the line the shutdown cut short
    async with batch_server(tmp_path) as (app, http):
        alice = sdk(http, "sk-alice")
        batch = await finished(alice, batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 8
        ran_after = app.state.usage.totals()["alice"].requests
        outputs = await output_lines(alice, batch.output_file_id)
    assert [line["custom_id"] for line in outputs] == [f"q{i}" for i in range(8)]
    assert done_before >= 2 and ran_after == 8 - done_before  # no line that was done ran again


def done_in_sqlite(path: Path, batch_id: str) -> int:
    """The lines the database holds as done (what a resume skips), read from the file."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM results WHERE batch_id = ?", (batch_id,)).fetchone()[0])


async def test_usage_and_budgets_survive_a_restart(tmp_path: Path) -> None:
    auth = {"keys": [{"name": "alice", "key_env": "ALICE", "scopes": ["inference"], "requests_per_minute": 1},
                     {"name": "ops", "key_env": "OPS", "scopes": ["admin"]}]}  # fmt: skip
    cli = {"enabled_models": [CHAT_MODEL], "auth": auth, "batch_api": {"enabled": False},
           "usage_store": {"enabled": True, "path": str(tmp_path / "usage.sqlite")}}  # fmt: skip
    keys = KeyRing.from_config(AuthConfig.model_validate(auth), SECRETS)
    ops = {"Authorization": "Bearer sk-ops"}
    async with serving(cli, keys=keys) as (_, http):
        alice = sdk(http, "sk-alice")
        await alice.chat.completions.create(model=CHAT_MODEL, messages=ASK, **GREEDY)
        with pytest.raises(openai.RateLimitError):
            await alice.chat.completions.create(model=CHAT_MODEL, messages=ASK)
        before = (await http.get("/v1/admin/usage", headers=ops)).json()
    async with serving(cli, keys=keys) as (_, http):
        after = (await http.get("/v1/admin/usage", headers=ops)).json()
        per_model = (await http.get("/v1/admin/usage?group_by=model&start_time=0", headers=ops)).json()
        with pytest.raises(openai.RateLimitError):  # its budget came back spent (1 a minute, used)
            await sdk(http, "sk-alice").chat.completions.create(model=CHAT_MODEL, messages=ASK)
    row = next(r for r in before["data"] if r["key"] == "alice")
    assert (row["requests"], row["rate_limited"], row["remaining"]["requests"]) == (1, 1, 0)
    assert row["input_tokens"] > 0 and row["output_tokens"] > 0
    assert after["data"] == before["data"] and after["windowed"] == before["windowed"]
    chat_row = next(r for r in per_model["windowed"] if (r["key"], r["model"]) == ("alice", CHAT_MODEL))
    assert chat_row["requests"] == 1 and chat_row["input_tokens"] == row["input_tokens"]
