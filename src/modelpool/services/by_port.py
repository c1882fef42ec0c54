"""Stopping a server found by its port (`modelpool down --port 8107`, or `:8107`), as the
agent sample's `--stop` does for model servers that outlive their stack.

A service in the registry on that port is stopped as `down` stops any. When none is
registered, the process listening there is stopped only if all of these hold — the rule
that keeps `down` from killing something unrelated:
1. an HTTP server answers on the port (GET /health, any status: a server, not a database
   or an SSH tunnel);
2. the listening process belongs to the user running `down`;
3. its command line is a modelpool server or an engine modelpool runs (ENGINE_MARKERS).
Then SIGTERM (to its process group when it leads one), SIGKILL after the grace period.
Anything else is left running, and the reason is said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
import psutil

from modelpool.services.process import terminate_group

ENGINE_MARKERS = (
    ("modelpool", "serve"),
    ("vllm", "serve"),
    ("vllm.entrypoints",),
    ("llama-server",),
    ("llama_cpp.server",),
)
"""Command-line words, all of which must appear (as words or a path's last part) for the
process to count as a server `down --port` may stop."""


@dataclass(frozen=True)
class PortOutcome:
    pid: int | None
    outcome: str
    """"terminated", "killed", "gone" (it exited meanwhile), "nothing" (no server answers
    there) or "refused" (not one we may stop: `reason` says why)."""
    reason: str = ""


async def stop_unregistered(port: int, grace_s: float, host: str = "127.0.0.1") -> PortOutcome:
    """Stop the server listening on `port` if the module's rule allows it."""
    if not await _answers(host, port):
        return PortOutcome(None, "nothing", f"no server answers on port {port}")
    pid = listening_pid(port)
    if pid is None:
        return PortOutcome(None, "refused", f"port {port} answers, but its process is not visible to this user")
    refusal = refusal_reason(pid)
    if refusal:
        return PortOutcome(pid, "refused", refusal)
    return PortOutcome(pid, await terminate_group(pid, grace_s, name=f"port {port}"))


def listening_pid(port: int) -> int | None:
    """The pid listening on TCP `port` (any address), when this user may see it."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for connection in connections:
        address = connection.laddr
        if connection.status == psutil.CONN_LISTEN and address and address[1] == port and connection.pid is not None:
            return connection.pid
    return None


def refusal_reason(pid: int) -> str:
    """Why `pid` may not be stopped ("" when it may): another user's, or not a server of ours."""
    try:
        process = psutil.Process(pid)
        owner, argv = process.uids().real, process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid {pid} cannot be inspected by this user"
    if owner != os.getuid():
        return f"pid {pid} belongs to another user"
    if not is_engine_command(argv):
        shown = os.path.basename(argv[0]) if argv else "?"
        return f"pid {pid} ({shown}) is not a modelpool or engine server"
    return ""


def is_engine_command(argv: list[str]) -> bool:
    words = {part for arg in argv for part in (arg, os.path.basename(arg))}
    return any(all(marker in words for marker in markers) for markers in ENGINE_MARKERS)


async def _answers(host: str, port: int) -> bool:
    """Whether an HTTP server answers there at all (any status: a 401 or a 404 is a server too)."""
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            await client.get(f"http://{host}:{port}/health")
    except httpx.HTTPError:
        return False
    return True
