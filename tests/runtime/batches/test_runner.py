"""The batch runner alone, with a stand-in for the app: a 429 is waited out and tried
again (not a failed line), and a batch past its window expires with what had finished."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from modelpool.errors import InvalidRequest, ObjectNotFound, StoreFull
from modelpool.owner import Owner
from modelpool.pool_api.batches import LineAnswer
from modelpool.runtime.batches.database import Database
from modelpool.runtime.batches.files import FileLimits, FileStore
from modelpool.runtime.batches.lines import read_lines
from modelpool.runtime.batches.runner import WINDOW_S, BatchRunner, TooManyBatches
from tests.polling import until

ALICE = Owner("alice")
LIMITS = FileLimits(max_bytes=10_000, max_lines=10, max_line_bytes=1000, key_bytes=100_000, key_files=10)


def line(custom_id: str) -> str:
    body = {"model": "m", "input": custom_id}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n"


async def runner_with(tmp_path: Path, lines: list[str]) -> tuple[BatchRunner, str]:
    db = Database(tmp_path / "b.sqlite")
    files = FileStore(db, tmp_path / "files", LIMITS)
    record = await files.add(ALICE, "in.jsonl", "batch", io.BytesIO("".join(lines).encode()))
    return BatchRunner(db, files, lambda endpoint, body: str(body["model"]), concurrency=1), record.id


async def test_a_429_is_tried_again_not_failed(tmp_path: Path) -> None:
    runner, file_id = await runner_with(tmp_path, [line("a")])
    answers = [LineAnswer(429, "r1", {"error": {}}, 0.0), LineAnswer(200, "r2", {"usage": {"prompt_tokens": 3}})]

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        assert owner == ALICE and endpoint == "/v1/embeddings"
        return answers.pop(0)

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await runner.idle()
    assert batch.status == "completed" and not answers
    assert (batch.counts.completed, batch.counts.failed, batch.usage["input_tokens"]) == (1, 0, 3)


async def test_past_its_window_a_batch_expires_with_what_finished(tmp_path: Path) -> None:
    runner, file_id = await runner_with(tmp_path, [line("a"), line("b"), line("c")])
    now = [1_000_000.0]
    runner.clock = lambda: now[0]

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        now[0] += WINDOW_S  # the first line takes the whole day
        return LineAnswer(200, "r", {})

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await runner.idle()
    assert batch.status == "expired" and batch.times["expired_at"] == 1_000_000 + WINDOW_S
    assert (batch.counts.total, batch.counts.completed) == (3, 1) and batch.output_file_id is not None
    assert batch.error_file_id is not None
    errors = runner.files.path_of(batch.error_file_id).read_text().splitlines()
    assert [(json.loads(e)["custom_id"], json.loads(e)["error"]["code"]) for e in errors] == [
        ("b", "batch_expired"), ("c", "batch_expired")]  # fmt: skip


def test_a_line_is_known_by_its_place_in_the_file(tmp_path: Path) -> None:
    """A line that no longer passes the check at a resume (its model gone) must not shift the
    lines after it onto the indices of lines already done."""
    path = tmp_path / "in.jsonl"
    path.write_text(line("a") + "not json\n\n" + line("c"))
    lines, errors, _ = read_lines(path, "/v1/embeddings", lambda endpoint, body: "m")
    assert [(x.index, x.custom_id) for x in lines] == [(0, "a"), (2, "c")]
    assert [e.line for e in errors] == [2]


async def test_an_ended_batch_keeps_one_pair_of_files(tmp_path: Path) -> None:
    """The output files' rows and the ended batch are written together (a restart while
    finalizing cannot keep a first pair beside a second)."""
    runner, file_id = await runner_with(tmp_path, [line("a"), line("b")])
    answers = [LineAnswer(200, "r1", {}), LineAnswer(400, "r2", {"error": {}})]

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        return answers.pop(0)

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await runner.idle()
    stored = runner.db.now(lambda c: c.execute("SELECT id FROM files WHERE purpose = 'batch_output'").fetchall())
    assert batch.status == "completed" and {r[0] for r in stored} == {batch.output_file_id, batch.error_file_id}
    again = BatchRunner(runner.db, FileStore(runner.db, tmp_path / "files", LIMITS), lambda e, b: "m", 1)
    assert again.get(batch.id, ALICE).output_file_id == batch.output_file_id


async def test_a_key_may_have_only_so_many_unfinished_batches(tmp_path: Path) -> None:
    runner, file_id = await runner_with(tmp_path, [line("a")])
    runner.key_batches = 1
    release = asyncio.Event()

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        await release.wait()
        return LineAnswer(200, "r", {})

    runner.execute = execute
    first = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    with pytest.raises(TooManyBatches, match=r"batch_api\.key_batches") as refused:
        await runner.create(ALICE, file_id, "/v1/embeddings", None)
    assert refused.value.status_code == 400 and refused.value.code == "too_many_batches"
    release.set()
    await runner.idle()
    assert first.status == "completed"
    await runner.create(ALICE, file_id, "/v1/embeddings", None)  # the first ended: room again
    await runner.idle()


async def test_a_cancel_stops_the_running_line_while_every_turn_is_taken(tmp_path: Path) -> None:
    """With one turn and a long line running, the cancel must not wait for that line to end
    (docs/batch.md: running lines stop at once)."""
    runner, file_id = await runner_with(tmp_path, [line("a"), line("b")])
    started, stopped = asyncio.Event(), asyncio.Event()

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        started.set()
        try:
            await asyncio.Event().wait()  # a line that would run for a long time
        except asyncio.CancelledError:
            stopped.set()
            raise
        raise AssertionError("unreachable")

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await asyncio.wait_for(started.wait(), timeout=5)
    await runner.cancel(batch.id, ALICE)
    await asyncio.wait_for(runner.idle(), timeout=5)
    assert stopped.is_set() and batch.status == "cancelled"
    assert (batch.counts.completed, batch.counts.failed) == (0, 0)

    async def quick(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        return LineAnswer(200, "r", {})

    runner.execute = quick  # the turns were given back: the next batch runs
    after = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await asyncio.wait_for(runner.idle(), timeout=5)
    assert after.status == "completed" and after.counts.completed == 2


async def test_outputs_stop_at_the_keys_quota_the_batch_failing_with_what_finished(tmp_path: Path) -> None:
    """Each answer here is ~30 KB against a 100 KB quota: the finished lines' outputs count
    as they are kept, the batch stops once they fill it, and its files hold those lines."""
    runner, file_id = await runner_with(tmp_path, [line(c) for c in "abcdefghij"])
    ran: list[bytes] = []

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        ran.append(body)
        return LineAnswer(200, "r", {"data": "x" * 30_000})

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await asyncio.wait_for(runner.idle(), timeout=10)
    assert batch.status == "failed" and [e.code for e in batch.errors] == ["storage_quota_exceeded"]
    assert "batch_api.key_storage_bytes" in batch.errors[0].message
    assert len(ran) == 4 and batch.counts.completed == 4  # the input's ~1 KB and 3 answers leave room for one
    assert batch.output_file_id is not None
    kept = runner.files.path_of(batch.output_file_id).read_text().splitlines()
    assert [json.loads(out)["custom_id"] for out in kept] == ["a", "b", "c", "d"]
    assert runner.db.now(lambda c: c.execute("SELECT COUNT(*) FROM results").fetchone()) == (0,)
    with pytest.raises(StoreFull, match="quota"):  # the outputs are the key's files now
        await runner.files.add(ALICE, "more.jsonl", "batch", io.BytesIO(line("k").encode()))


async def test_a_cancel_while_the_file_is_checked_is_kept(tmp_path: Path) -> None:
    checking, resume = threading.Event(), threading.Event()

    def slow_check(endpoint: str, body: dict[str, Any]) -> str:
        checking.set()
        resume.wait(timeout=10)
        return "m"

    runner, file_id = await runner_with(tmp_path, [line("a"), line("b")])
    runner.check = slow_check
    ran: list[bytes] = []

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        ran.append(body)
        return LineAnswer(200, "r", {})

    runner.execute = execute
    batch = await runner.create(ALICE, file_id, "/v1/embeddings", None)
    await asyncio.to_thread(checking.wait, 10)
    assert batch.status == "validating"
    assert (await runner.cancel(batch.id, ALICE)).status == "cancelling"
    resume.set()
    await asyncio.wait_for(runner.idle(), timeout=10)
    assert batch.status == "cancelled" and ran == []


async def test_uploads_ending_together_cannot_all_pass_the_quota(tmp_path: Path) -> None:
    """Every upload's database write is held until each upload has either reached its write
    or been refused: the moment a second upload used to slip past the quota check."""
    db = Database(tmp_path / "b.sqlite")
    files = FileStore(db, tmp_path / "files", LIMITS)
    run, writes, held = db.run, asyncio.Event(), [0]

    async def held_run(work: Any) -> Any:
        held[0] += 1
        await writes.wait()
        return await run(work)

    files.db.run = held_run  # type: ignore[method-assign]
    upload = "".join(line(f"{i:04}" + "y" * 300) for i in range(5)).encode()
    files.limits = replace(LIMITS, key_bytes=len(upload) * 5 // 2)  # room for two
    uploads = [asyncio.create_task(files.add(ALICE, f"{i}.jsonl", "batch", io.BytesIO(upload))) for i in range(5)]
    await until(lambda: held[0] + sum(task.done() for task in uploads) == 5, "every upload to write or be refused")
    writes.set()
    results = await asyncio.gather(*uploads, return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["FileRecord"] * 2 + ["StoreFull"] * 3, results


async def test_a_line_nested_too_deeply_is_a_400_naming_it(tmp_path: Path) -> None:
    roomy = replace(LIMITS, max_bytes=50_000, max_line_bytes=20_000)
    files = FileStore(Database(tmp_path / "b.sqlite"), tmp_path / "files", roomy)
    deep = line("a") + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(InvalidRequest, match="Line 2 nests its JSON too deeply") as refused:
        await files.add(ALICE, "deep.jsonl", "batch", io.BytesIO(deep.encode()))
    assert refused.value.status_code == 400
    assert list((tmp_path / "files").iterdir()) == []


async def test_a_key_keeps_a_bounded_number_of_ended_batches(tmp_path: Path) -> None:
    runner, file_id = await runner_with(tmp_path, [line("a")])
    runner.key_batches_kept = 2

    async def execute(owner: Owner, endpoint: str, body: bytes) -> LineAnswer:
        return LineAnswer(200, "r", {})

    runner.execute = execute
    made = []
    for _ in range(4):
        made.append(await runner.create(ALICE, file_id, "/v1/embeddings", None))
        await asyncio.wait_for(runner.idle(), timeout=5)
    listed = [b.id for b in runner.list(ALICE, limit=100, after=None).data]
    assert listed == [b.id for b in made[:0:-1]]  # the newest three: the one just made and two ended before it
    with pytest.raises(ObjectNotFound):
        runner.get(made[0].id, ALICE)
    assert made[0].output_file_id is not None
    assert runner.files.get(made[0].output_file_id, ALICE)  # its files stay, in the key's quota
    again = BatchRunner(runner.db, FileStore(runner.db, tmp_path / "files", LIMITS), lambda e, b: "m", 1)
    assert [b.id for b in again.list(ALICE, limit=100, after=None).data] == listed  # forgotten in SQLite too


async def test_an_admin_cannot_make_a_batch_of_another_keys_file(tmp_path: Path) -> None:
    """It would be made, then fail as 'deleted': the runner reads the file as the batch's key."""
    runner, file_id = await runner_with(tmp_path, [line("a")])
    admin = Owner("ops", admin=True)
    assert runner.files.get(file_id, admin)  # the admin sees it ...
    with pytest.raises(InvalidRequest, match="belongs to another key") as refused:
        await runner.create(admin, file_id, "/v1/embeddings", None)  # ... but does not run it as itself
    assert refused.value.param == "input_file_id" and runner.list(admin, 10, None).data == []
