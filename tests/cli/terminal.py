"""A command in a pseudo-terminal of its own, driven as a user types: it reads what the
command writes, waits (with a deadline) for text to appear, and sends keys (Ctrl-C is
the byte the terminal turns into SIGINT for the command)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from collections.abc import Iterator, Mapping, Sequence

CTRL_C = b"\x03"
CTRL_D = b"\x04"


class Terminal:
    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.output = ""
        self.exit_code: int | None = None

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait_for(self, text: str, *, after: int = 0, timeout_s: float = 120) -> int:
        """Read until `text` appears at or after offset `after`; its offset. Fails with the
        screen so far when it does not come."""
        deadline = time.monotonic() + timeout_s
        while (found := self.output.find(text, after)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{text!r} never appeared; the terminal shows:\n{self.output[-2000:]}")
        return found

    def wait_exit(self, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while self.exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout_s}s:\n{self.output[-2000:]}")
            self._read(0.1)  # keep draining the terminal: a full buffer would block the command
        return self.exit_code

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], min(timeout_s, 1.0))
        if not ready:
            return True  # nothing yet: the caller checks its deadline
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the command closed the terminal (it exited)
            return False
        self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        return bool(chunk)


@contextlib.contextmanager
def terminal(argv: Sequence[str], env: Mapping[str, str]) -> Iterator[Terminal]:
    """Run `argv` with a pseudo-terminal as its stdin, stdout and controlling terminal; kill
    it (by its pid) if the test leaves it running."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become the command
        try:
            os.execvpe(argv[0], list(argv), dict(env))
        finally:
            os._exit(127)
    term = Terminal(pid, fd)
    try:
        yield term
    finally:
        if term.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
