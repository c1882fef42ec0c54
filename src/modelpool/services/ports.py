"""Ports for processes modelpool starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now on `host` (the OS picks it; another process could still take it
    before ours binds, which the health check then reports)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `port` on `host` now: a listener on it (on any interface)
    makes it busy. SO_REUSEADDR as servers set it, so connections of a stopped server still
    in TIME_WAIT do not."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
