"""The bounded pools' bookkeeping, without running jobs."""

from __future__ import annotations

from modelpool.offload import BoundedProcesses


def test_a_broken_pool_is_replaced_once_whoever_saw_it_break() -> None:
    """Two jobs that both saw the pool break: the second must not shut down the new pool the
    first made (its shutdown cancels the first's retry)."""
    processes = BoundedProcesses("test", workers=1, preload=())
    broken = processes._pool()
    processes._replace(broken)  # the first job
    fresh = processes._pool()
    processes._replace(broken)  # the second job, late
    assert processes._pool() is fresh
    assert not fresh._shutdown_thread
    fresh.shutdown()
