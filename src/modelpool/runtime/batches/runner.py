"""Batches: made from an uploaded file, checked whole before anything runs, then run in
the background through the same routes a client calls, as the key that made the batch
(so its rate limits and usage apply), a bounded number of requests at a time, at low
priority in the models' queues. A line refused with 429 (its key's budget spent, its
queue's share full) waits as Retry-After says and is tried again: a batch is patient.

States: validating → in_progress → finalizing → completed; validating → failed (a line
is wrong); in_progress → cancelling → cancelled; in_progress → expired past the 24 h
window. Each finished line is a row in SQLite, so after a restart a batch resumes where it
stopped: lines already done are not run again. Cancelling stops the running requests at
once (their lines are not counted); the output and error files hold what finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from modelpool.errors import InvalidRequest, ObjectNotFound
from modelpool.owner import Owner
from modelpool.pool_api.batches import (
    TERMINAL,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineAnswer,
    LineError,
    Page,
    RequestCounts,
)
from modelpool.runtime.batches import records
from modelpool.runtime.batches.database import Database
from modelpool.runtime.batches.files import FileStore, insert_file, new_id, page
from modelpool.runtime.batches.lines import BatchLine, LineCheck, check_lines, read_lines, stream_lines
from modelpool.runtime.batches.outputs import expired_row, line_output, write_outputs

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOW_S = 24 * 3600
MAX_RETRY_WAIT_S = 60.0
"""Longest wait before a line refused with 429 (its key's budget, its queue's cap) is tried again."""
Lines = list[BatchLine]
_FULL = ("The batch stopped: this key's files and batch outputs reached its quota of {quota} bytes "
         "(batch_api.key_storage_bytes). The output and error files hold the lines that finished.")  # fmt: skip
Execute = Callable[[Owner, str, bytes], Awaitable[LineAnswer]]
"""(the batch's owner, endpoint, body) → what the endpoint answered, as that key."""


class BatchRunner:
    """A `BatchService`."""

    def __init__(
        self,
        db: Database,
        files: FileStore,
        check: LineCheck,
        concurrency: int,
        key_batches: int = 100,
        key_batches_kept: int = 1000,
    ) -> None:
        self.db = db
        self.files = files
        self.check = check
        self.execute: Execute | None = None
        """Set by the server once the app exists (it runs each line through the app)."""
        self.clock: Callable[[], float] = time.time
        self.key_batches = key_batches
        """Unfinished batches one key may have (`batch_api.key_batches`)."""
        self.key_batches_kept = key_batches_kept
        """Ended batches one key keeps (`batch_api.key_batches_kept`): past it the oldest is forgotten."""
        self.lock_path: Path | None = None
        """A file whose lock `start` takes: a second server on the same directory would resume
        the same batches and run their lines twice, so it serves neither batches nor files."""
        self._lock: IO[bytes] | None = None
        self._turns = asyncio.Semaphore(concurrency)
        self._batches = {b.id: b for b in db.now(records.load_batches)}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._refused: dict[str, str] = {}
        """Batches whose key was refused (revoked since): the batch fails, its lines stop."""
        self._held: dict[str, int] = {}
        """Bytes of the finished lines' outputs each running batch keeps in SQLite until its
        files are written: they count against its key's storage quota."""
        self._full: set[str] = set()
        """Batches stopped because their key's quota is full: they end `failed`, their
        finished lines kept in their files."""
        files.held = self._held_by

    def start(self) -> None:
        """Resume every batch a previous run left unfinished."""
        if self.lock_path is not None:
            self._lock = _locked(self.lock_path)
            if self._lock is None:
                self.files.off = f"another modelpool server uses its directory {self.lock_path.parent}"
                log.warning("the Batch and Files APIs are off: %s (set batch_api.dir)", self.files.off)
                return
        for batch in self._batches.values():
            if batch.status not in TERMINAL:
                self._spawn(batch)

    async def close(self) -> None:
        """Stop the work; the batches stay as they are in SQLite and resume at the next start."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.db.close()
        if self._lock is not None:
            self._lock.close()  # the directory is free for the next server

    async def create(
        self, owner: Owner, input_file_id: str, endpoint: str, metadata: dict[str, str] | None
    ) -> BatchRecord:
        source = self.files.get(input_file_id, owner)  # off (another server's directory): 503
        if source.purpose != "batch":
            raise InvalidRequest(f"File {input_file_id} has purpose '{source.purpose}', not 'batch'.",
                                 param="input_file_id")  # fmt: skip
        if source.owner != owner.name:  # an admin sees every key's files, but a batch reads its own key's
            raise InvalidRequest(f"File {input_file_id} belongs to another key: a batch runs as the key that "
                                 "makes it, from a file that key uploaded.", param="input_file_id")  # fmt: skip
        unfinished = sum(1 for b in self._batches.values() if b.owner == owner.name and b.status not in TERMINAL)
        if unfinished >= self.key_batches:
            raise TooManyBatches(f"This key has {unfinished} unfinished batches, the most allowed "
                                 "(batch_api.key_batches): wait for one to end or cancel one.")  # fmt: skip
        now = int(self.clock())
        batch = BatchRecord(new_id("batch"), owner.name, endpoint, input_file_id, "24h", now, now + WINDOW_S,
                            metadata=metadata, counts=RequestCounts(total=source.lines))  # fmt: skip
        self._batches[batch.id] = batch
        forgotten = self._oldest_ended_past_the_bound(owner.name)
        for old in forgotten:
            del self._batches[old]
        await self.db.run(lambda c: _forget_and_save(c, forgotten, batch))
        self._spawn(batch)
        return batch

    def _oldest_ended_past_the_bound(self, owner: str) -> list[str]:
        """The key's ended batches beyond `key_batches_kept`, oldest first (their files stay,
        counted in the key's quota): a key making batches in a loop keeps a bounded number."""
        ended = [b.id for b in self._batches.values() if b.owner == owner and b.status in TERMINAL]
        return ended[: max(0, len(ended) - self.key_batches_kept)]

    def get(self, batch_id: str, caller: Owner) -> BatchRecord:
        self.files.check_on()  # off (another server holds the directory): 503
        found = self._batches.get(batch_id)
        if found is None or not caller.sees(found.owner):
            raise ObjectNotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return found

    def list(self, caller: Owner, limit: int, after: str | None) -> Page:
        self.files.check_on()
        mine = [b for b in self._batches.values() if caller.sees(b.owner)]
        return page(mine[::-1], limit, after, lambda b: b.id)

    async def cancel(self, batch_id: str, caller: Owner) -> BatchRecord:
        batch = self.get(batch_id, caller)
        if batch.status in TERMINAL or batch.status in ("cancelling", "finalizing"):
            raise InvalidRequest(f"Cannot cancel a batch whose status is '{batch.status}'.", param="batch_id")
        await self._enter(batch, "cancelling")
        return batch

    async def idle(self) -> None:
        """Until every batch's background work has ended (tests)."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _spawn(self, batch: BatchRecord) -> None:
        task = asyncio.create_task(self._run(batch), name=f"batch {batch.id}")
        self._tasks[batch.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(batch.id, None))

    async def _run(self, batch: BatchRecord) -> None:
        try:
            runnable = await self._validated(batch)
            if runnable and batch.status == "in_progress":
                await self._run_lines(batch)
            if batch.id in self._refused:
                await self._fail_refused(batch)
            if batch.status in ("in_progress", "finalizing", "cancelling"):
                await self._finalize(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a broken disk: the batch fails, saying why, the server goes on
            log.exception("batch %s failed", batch.id)
            batch.errors.append(LineError("internal_error", f"The batch stopped: {type(exc).__name__}."))
            await self._enter(batch, "failed")
            with contextlib.suppress(Exception):  # nothing reads a failed batch's lines: free their rows
                await self.db.run(lambda c: records.drop_results(c, batch.id))
        finally:
            self._held.pop(batch.id, None)
            self._full.discard(batch.id)

    async def _validated(self, batch: BatchRecord) -> bool:
        """Whether the input may run; a batch with a wrong line fails here, before any runs."""
        if batch.status == "cancelling":
            return False
        try:
            source = self.files.get(batch.input_file_id, Owner(batch.owner))
        except ObjectNotFound:
            batch.errors.append(LineError("file_not_found", "The input file was deleted.", None, "input_file_id"))
            await self._enter(batch, "failed")
            return False
        if batch.status == "validating":
            count, errors, model = await asyncio.to_thread(
                check_lines, self.files.path(source), batch.endpoint, self.check
            )
            if _cancelled(batch):  # while its file was checked
                return False
            if errors:
                batch.errors = errors
                await self._enter(batch, "failed")
                return False
            batch.model, batch.counts = model, RequestCounts(total=count)
            await self._enter(batch, "in_progress")
        return True

    async def _run_lines(self, batch: BatchRecord) -> None:
        rows = await self.db.run(lambda c: records.result_counts(c, batch.id))
        _recount(batch, rows)  # a resumed batch: what finished before the restart
        self._held[batch.id] = sum(row[4] for row in rows)
        done = {row[0] for row in rows}
        running: set[asyncio.Task[None]] = set()
        path = self.files.path(self.files.get(batch.input_file_id, Owner(batch.owner)))
        lines = stream_lines(path, batch.endpoint, self.check)
        try:
            while await self._turn(batch):  # a line is read only once it may run
                line = await asyncio.to_thread(_next_not_in, lines, done)
                if line is None or not self._still_runs(batch) or self._expired(batch):
                    self._turns.release()
                    break
                task = asyncio.create_task(self._run_line(batch, line))
                running.add(task)
                task.add_done_callback(running.discard)
            while running and self._still_runs(batch):
                await asyncio.wait(set(running), timeout=0.5)  # a cancel is seen within half a second
        finally:
            for task in running:
                task.cancel()  # cancelled or shutting down: what runs stops now, its line is not done
            await asyncio.gather(*running, return_exceptions=True)

    async def _turn(self, batch: BatchRecord) -> bool:
        """A turn for the batch's next line; False, holding none, once the batch no longer
        runs. Why not a plain acquire: while every turn is taken by a running line, the
        cancel must still be seen (within half a second) so that the running lines are
        stopped at once, not when the longest of them ends."""
        acquire = asyncio.ensure_future(self._turns.acquire())
        try:
            while not acquire.done() and self._still_runs(batch):
                await asyncio.wait({acquire}, timeout=0.5)
        finally:
            if not acquire.done():
                acquire.cancel()
                await asyncio.gather(acquire, return_exceptions=True)
            if acquire.done() and not acquire.cancelled() and not self._still_runs(batch):
                self._turns.release()  # taken as the batch stopped: not this batch's any more
        return acquire.done() and not acquire.cancelled() and self._still_runs(batch)

    def _still_runs(self, batch: BatchRecord) -> bool:
        return batch.status == "in_progress" and batch.id not in self._refused and batch.id not in self._full

    def _held_by(self, owner: str) -> int:
        return sum(self._held.get(b.id, 0) for b in self._batches.values() if b.owner == owner)

    async def _run_line(self, batch: BatchRecord, line: BatchLine) -> None:
        try:
            assert self.execute is not None, "the server sets `execute` before batches start"
            answer = await self.execute(Owner(batch.owner), batch.endpoint, line.body)
            while answer.status_code == 429 and batch.status == "in_progress":  # the queue or budget is full
                await asyncio.sleep(min(max(answer.retry_after_s or 1.0, 0.5), MAX_RETRY_WAIT_S))  # back off
                answer = await self.execute(Owner(batch.owner), batch.endpoint, line.body)
            if batch.status != "in_progress":
                return  # cancelled while it ran: not counted
            if answer.status_code in (401, 403):  # its key was revoked: no line of it may run, none is a result
                self._refused.setdefault(batch.id, _message(answer))
                return
            ok = 200 <= answer.status_code < 300
            output, tokens = line_output(new_id("batch_req"), line.custom_id, answer)
            await self.db.run(lambda c: records.save_result(c, batch.id, line.index, ok, output, tokens))
            _count(batch, ok, tokens)
            self._held[batch.id] = self._held.get(batch.id, 0) + len(output)  # ASCII: characters are bytes
            if self.files.room(batch.owner) <= 0:  # kept, and no line after it runs
                self._full.add(batch.id)
        finally:
            self._turns.release()

    async def _finalize(self, batch: BatchRecord) -> None:
        """Write the output and error files from the finished lines, and end the batch.
        Expired, the lines never run go to the error file as `batch_expired` (OpenAI's)."""
        ending: BatchStatus = "cancelled" if batch.status == "cancelling" else "completed"
        if batch.status == "in_progress":
            await self._enter(batch, "finalizing")  # from here a cancel is refused: the batch is ending
        rows = await self.db.run(lambda c: records.result_counts(c, batch.id))
        expired: list[records.ResultRow] = []
        if batch.id in self._full:
            ending = "failed"
            batch.errors.append(LineError("storage_quota_exceeded", _FULL.format(quota=self.files.limits.key_bytes)))
        elif ending == "completed" and len(rows) < batch.counts.total and self._expired(batch):
            ending = "expired"
            done = {row[0] for row in rows}
            lines = await asyncio.to_thread(self._lines_of, batch)
            expired = [expired_row(line) for line in lines if line.index not in done]
        made = await self.db.run(lambda c: write_outputs(self.files, c, batch, expired))
        _recount(batch, rows)
        named = {f.filename.rsplit("_", 1)[-1]: f.id for f in made}  # "output.jsonl", "error.jsonl"
        ended = replace(batch, status=ending, times={**batch.times, f"{ending}_at": int(self.clock())},
                        output_file_id=named.get("output.jsonl"), error_file_id=named.get("error.jsonl"))  # fmt: skip
        await self.db.run(lambda c: _end(c, ended, made))
        for record in made:  # the files first: a client that sees the batch ended can fetch them
            self.files.remember(record)
        self._held.pop(batch.id, None)  # counted as its files now
        batch.output_file_id, batch.error_file_id = ended.output_file_id, ended.error_file_id
        batch.times, batch.status = ended.times, ending

    def _lines_of(self, batch: BatchRecord) -> Lines:
        source = self.files.get(batch.input_file_id, Owner(batch.owner))
        return read_lines(self.files.path(source), batch.endpoint, self.check)[0]

    async def _fail_refused(self, batch: BatchRecord) -> None:
        """The whole batch fails once (not each of its lines), saying why."""
        reason = self._refused.pop(batch.id)
        batch.errors.append(LineError("key_revoked", f"The batch's API key was refused: {reason}"))
        await self._enter(batch, "failed")
        await self.db.run(lambda c: records.drop_results(c, batch.id))
        self._held.pop(batch.id, None)

    async def _enter(self, batch: BatchRecord, status: BatchStatus) -> None:
        batch.status = status
        batch.times[f"{status}_at"] = int(self.clock())
        await self._save(batch)

    async def _save(self, batch: BatchRecord) -> None:
        await self.db.run(lambda c: records.save_batch(c, batch))

    def _expired(self, batch: BatchRecord) -> bool:
        return self.clock() >= batch.expires_at


def _forget_and_save(db: sqlite3.Connection, forgotten: list[str], batch: BatchRecord) -> None:
    for batch_id in forgotten:
        db.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
        records.drop_results(db, batch_id)
    records.save_batch(db, batch)


def _end(db: sqlite3.Connection, batch: BatchRecord, made: list[FileRecord]) -> None:
    """The files' rows, the ended batch and its results dropped, in one transaction: a
    restart while finalizing writes the files once more, never keeps two pairs."""
    for record in made:
        insert_file(db, record)
    records.save_batch(db, batch)
    records.drop_results(db, batch.id)


def _locked(path: Path) -> IO[bytes] | None:
    """`path` opened and locked for this process (None: another holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "ab")  # noqa: SIM115 - held open while the runner runs: that is the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _cancelled(batch: BatchRecord) -> bool:
    return batch.status == "cancelling"


def _next_not_in(lines: Iterator[BatchLine], done: set[int]) -> BatchLine | None:
    """The next line not done before a restart (None: the file ended)."""
    return next((line for line in lines if line.index not in done), None)


class TooManyBatches(InvalidRequest):
    code = "too_many_batches"


def _message(answer: LineAnswer) -> str:
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message)[:300] if message else f"HTTP {answer.status_code}"


def _count(batch: BatchRecord, ok: bool, tokens: tuple[int, int]) -> None:
    if ok:
        batch.counts.completed += 1
    else:
        batch.counts.failed += 1
    _add_usage(batch.usage, *tokens)


def _recount(batch: BatchRecord, rows: list[records.ResultCount]) -> None:
    """From what SQLite holds (a resumed batch's counts in memory start from zero)."""
    batch.counts.completed = sum(1 for row in rows if row[1])
    batch.counts.failed = sum(1 for row in rows if not row[1])
    batch.usage = {}
    for row in rows:
        _add_usage(batch.usage, row[2], row[3])


def _add_usage(usage: dict[str, Any], tokens_in: int, tokens_out: int) -> None:
    usage["input_tokens"] = usage.get("input_tokens", 0) + tokens_in
    usage["output_tokens"] = usage.get("output_tokens", 0) + tokens_out
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
