"""Questions about processes by pid: alive (a zombie is not), the same process as recorded
(a pid can be reused), and memory of a whole process tree."""

from __future__ import annotations

import asyncio
import os
import time

import psutil


def is_alive(pid: int, created: float | None = None) -> bool:
    """Running and not a zombie; with `created`, also the very process recorded then."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(process.create_time() - created) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


async def wait_gone(pid: int, timeout_s: float) -> bool:
    """Poll until the process is gone; False if it is still there after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while is_alive(pid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (vLLM's workers, a container's processes under its
    init as the host sees them); [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants (an engine's workers count)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def started_by_us(pid: int, created: float) -> bool:
    """The very process recorded (pid and creation time) and run by this user: the only
    kind modelpool stops from a record, never another user's process that took the pid."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - created) < 1.0 and process.uids().real == os.getuid()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
