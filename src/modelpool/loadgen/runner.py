"""Concurrency levels: a fixed number of requests or a duration, `concurrency` in flight at
once, each in-flight slot with a connection (and an httpx client) of its own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx

from modelpool.loadgen.records import RequestRecord
from modelpool.loadgen.requests import send
from modelpool.loadgen.spec import LoadPlan, LoadSpec
from modelpool.loadgen.stats import LevelSummary, summarize

Progress = Callable[[RequestRecord], None]
"""Called once per finished request (a progress bar's advance)."""


@dataclass
class LevelRun:
    """One concurrency level's requests and what they add up to."""

    summary: LevelSummary
    records: list[RequestRecord]


class Clients:
    """The run's connections: one single-connection httpx client per in-flight slot, made
    when first used and kept for the run. Not one client with a pool of N: httpcore's pool
    scans every connection for every request, which cost 2.6 ms of CPU a request at 32
    connections here against 0.5 ms this way (measured with 32 concurrent embeddings), CPU
    the server being measured would otherwise lose. Connections are kept alive shorter than
    servers' idle cut-off (llama-server closes one idle for 5 s). The clients share one TLS
    context: each would otherwise parse the CA bundle into its own (256 clients: 3.7 s of
    CPU and ~200 MB before the first request)."""

    def __init__(self, spec: LoadSpec) -> None:
        self._limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=spec.keepalive_s)
        self._timeout = httpx.Timeout(spec.timeout_s)
        self._tls = httpx.create_ssl_context(trust_env=False)  # what each client would make: certifi's CAs
        self._slots: list[httpx.AsyncClient] = []

    def slot(self, number: int) -> httpx.AsyncClient:
        while len(self._slots) <= number:
            client = httpx.AsyncClient(limits=self._limits, timeout=self._timeout, verify=self._tls, trust_env=False)
            self._slots.append(client)
        return self._slots[number]

    async def aclose(self) -> None:
        for client in self._slots:
            await client.aclose()
        self._slots.clear()


@asynccontextmanager
async def open_client(spec: LoadSpec, concurrency: int) -> AsyncIterator[Clients]:
    """The connections of a whole run (up to `concurrency` of them, opened as needed), closed
    at the end."""
    clients = Clients(spec)
    try:
        for number in range(concurrency):
            clients.slot(number)
        yield clients
    finally:
        await clients.aclose()


NextRequest = Callable[[float], tuple[RequestRecord, str] | None]
"""Given the seconds since the level began, the next request to send and its prompt, or
None when the level has no more to start."""


async def _drive(
    clients: Clients, spec: LoadSpec, slots: int, next_request: NextRequest, progress: Progress | None
) -> None:
    """`slots` workers, each sending one request at a time on its own connection, until
    `next_request` has none left for it."""
    level_start = time.perf_counter()

    async def worker(slot: int) -> None:
        client = clients.slot(slot)
        # One clock reading decides and stamps: a request is never recorded as started
        # later than the moment that allowed it (a duration level starts none after its end).
        while (taken := next_request(elapsed := time.perf_counter() - level_start)) is not None:
            record, prompt = taken
            record.started_s = elapsed
            await send(client, spec, prompt, record)
            if progress is not None:
                progress(record)

    async with anyio.create_task_group() as group:
        for slot in range(slots):
            group.start_soon(worker, slot)


async def run_batch(
    clients: Clients,
    spec: LoadSpec,
    prompts: Sequence[str],
    concurrency: int,
    *,
    first_index: int = 0,
    progress: Progress | None = None,
) -> list[RequestRecord]:
    """Each prompt once, `concurrency` at a time; the records in prompt order."""
    records = [RequestRecord(first_index + i, concurrency) for i in range(len(prompts))]
    queue = iter(range(len(prompts)))  # the workers share one iterator: each prompt goes to exactly one

    def next_prompt(_elapsed: float) -> tuple[RequestRecord, str] | None:
        i = next(queue, None)
        return None if i is None else (records[i], prompts[i])

    await _drive(clients, spec, min(concurrency, len(prompts)), next_prompt, progress)
    return records


async def run_for(
    clients: Clients,
    spec: LoadSpec,
    concurrency: int,
    duration_s: float,
    *,
    first_index: int = 0,
    progress: Progress | None = None,
) -> list[RequestRecord]:
    """`concurrency` requests in flight until `duration_s` has passed; none starts after it
    (those in flight finish, each within the spec's timeout)."""
    records: list[RequestRecord] = []

    def until_the_end(elapsed: float) -> tuple[RequestRecord, str] | None:
        if elapsed >= duration_s:
            return None
        record = RequestRecord(first_index + len(records), concurrency)
        records.append(record)
        return record, spec.prompts[record.index % len(spec.prompts)]

    await _drive(clients, spec, concurrency, until_the_end, progress)
    return records


async def run_level(
    clients: Clients,
    spec: LoadSpec,
    plan: LoadPlan,
    concurrency: int,
    *,
    first_index: int = 0,
    progress: Progress | None = None,
) -> LevelRun:
    """One level of the plan, timed from its first send to its last reply."""
    began = time.perf_counter()
    if plan.requests is not None:
        prompts = [spec.prompts[(first_index + i) % len(spec.prompts)] for i in range(plan.requests)]
        records = await run_batch(clients, spec, prompts, concurrency, first_index=first_index, progress=progress)
    else:
        assert plan.duration_s is not None  # LoadPlan holds exactly one of the two
        records = await run_for(clients, spec, concurrency, plan.duration_s, first_index=first_index, progress=progress)
    wall_s = time.perf_counter() - began
    return LevelRun(summarize(records, concurrency, wall_s), records)


async def run_sweep(
    spec: LoadSpec,
    plan: LoadPlan,
    *,
    progress: Callable[[int], Progress | None] | None = None,
) -> tuple[list[RequestRecord], list[LevelRun]]:
    """The warm-up (its records apart), then each level in order. Every request is a new
    index into the prompts, so a server's prompt cache never sees the same request twice
    when there are enough prompts. `progress(level)` gives that level's callback."""
    async with open_client(spec, max(plan.concurrency)) as clients:
        warm_prompts = [spec.prompts[i % len(spec.prompts)] for i in range(plan.warmup)]
        warmup = await run_batch(clients, spec, warm_prompts, min(plan.concurrency), first_index=0)
        runs: list[LevelRun] = []
        index = plan.warmup
        for level in plan.concurrency:
            callback = progress(level) if progress is not None else None
            run = await run_level(clients, spec, plan, level, first_index=index, progress=callback)
            index += len(run.records)
            runs.append(run)
    return warmup, runs
