"""Concurrency levels: a fixed number of requests or a duration, `concurrency` in flight at
once, over one httpx client whose pool is sized to the concurrency."""

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


@asynccontextmanager
async def open_client(spec: LoadSpec, concurrency: int) -> AsyncIterator[httpx.AsyncClient]:
    """One client for a whole run: as many connections as requests in flight, kept alive
    shorter than servers' idle cut-off (a reused connection the server had closed fails)."""
    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=spec.keepalive_s
    )
    timeout = httpx.Timeout(spec.timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        yield client


async def run_batch(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    prompts: Sequence[str],
    concurrency: int,
    *,
    first_index: int = 0,
    progress: Progress | None = None,
) -> list[RequestRecord]:
    """Each prompt once, `concurrency` at a time; the records in prompt order."""
    records = [RequestRecord(first_index + i, concurrency) for i in range(len(prompts))]
    queue = iter(range(len(prompts)))
    level_start = time.perf_counter()

    async def worker() -> None:
        for i in queue:  # the workers share one iterator: each prompt goes to exactly one
            records[i].started_s = time.perf_counter() - level_start
            await send(client, spec, prompts[i], records[i])
            if progress is not None:
                progress(records[i])

    async with anyio.create_task_group() as group:
        for _ in range(min(concurrency, len(prompts))):
            group.start_soon(worker)
    return records


async def run_for(
    client: httpx.AsyncClient,
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
    level_start = time.perf_counter()
    deadline = level_start + duration_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            record = RequestRecord(first_index + len(records), concurrency)
            records.append(record)
            record.started_s = time.perf_counter() - level_start
            await send(client, spec, spec.prompts[record.index % len(spec.prompts)], record)
            if progress is not None:
                progress(record)

    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker)
    return records


async def run_level(
    client: httpx.AsyncClient,
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
        records = await run_batch(client, spec, prompts, concurrency, first_index=first_index, progress=progress)
    else:
        assert plan.duration_s is not None  # LoadPlan holds exactly one of the two
        records = await run_for(client, spec, concurrency, plan.duration_s, first_index=first_index, progress=progress)
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
    async with open_client(spec, max(plan.concurrency)) as client:
        warm_prompts = [spec.prompts[i % len(spec.prompts)] for i in range(plan.warmup)]
        warmup = await run_batch(client, spec, warm_prompts, min(plan.concurrency), first_index=0)
        runs: list[LevelRun] = []
        index = plan.warmup
        for level in plan.concurrency:
            callback = progress(level) if progress is not None else None
            run = await run_level(client, spec, plan, level, first_index=index, progress=callback)
            index += len(run.records)
            runs.append(run)
    return warmup, runs
