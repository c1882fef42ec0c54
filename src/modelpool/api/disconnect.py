"""A request's client leaving, as a callback: the server's protocol fires it when the
connection is lost (modelpool.server.http_protocol puts one in each request's scope under
`extensions[DISCONNECT]`). Why: watching for `http.disconnect` otherwise takes a task per
request blocked on `receive()` through every middleware's wrapper, and its cancellation at the
end; a callback costs a list append."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

DISCONNECT = "modelpool.disconnect"


class Disconnect:
    __slots__ = ("_callbacks", "happened")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.happened = False

    def add(self, callback: Callable[[], None]) -> None:
        """`callback()` when the client leaves: at once if it has left already."""
        if self.happened:
            callback()
        else:
            self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        if self.happened:
            return
        self.happened = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def attach(scope: MutableMapping[str, Any]) -> None:
    """Give a request's scope its `Disconnect` (the server, as the request begins)."""
    scope.setdefault("extensions", {})[DISCONNECT] = Disconnect()


def disconnect_of(scope: Mapping[str, Any]) -> Disconnect | None:
    """The request's `Disconnect`, if its server gave it one."""
    found = (scope.get("extensions") or {}).get(DISCONNECT)
    return found if isinstance(found, Disconnect) else None
