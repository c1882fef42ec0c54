"""Who a stored thing belongs to: the API key that wrote it (stored responses, transcript
sources). Keys see only what they wrote; a key with the admin scope sees everything.

And who is calling: the key middleware (`server/auth.py`) names the caller of each request
(`acting_for`); the HTTP routes, the MCP tools and the wire schemas read it here, so none
of them has to know the others or the middleware.

With no keys configured nothing is checked anywhere (the admin routes are open too), so
every caller is the one anonymous owner and sees everything, whichever key wrote it while
keys were configured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import Any

from modelpool.errors import PermissionDenied


@dataclass(frozen=True)
class Owner:
    name: str
    """The key's `name` in the config ("" without keys)."""
    admin: bool = False
    """The key holds the admin scope: it sees what every key wrote."""

    def sees(self, owner: str) -> bool:
        """Whether this caller may read what `owner` wrote."""
        return self.admin or owner == self.name


ANONYMOUS = Owner("", admin=True)
"""Every caller of a server without keys."""


class Priority(str, Enum):
    """A caller's class in a model's queue: a higher class goes first (see runtime/scheduling.py)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    """Also the class of background work (the Batch API)."""

    @property
    def rank(self) -> int:
        """2 for high, 1 for normal, 0 for low."""
        return _RANKS[self]


_RANKS = {Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 0}


@dataclass(frozen=True)
class Schedule:
    """Where a caller's requests go in a model's queue: its class, and its share inside it."""

    party: str = ""
    """Who shares fairly with whom: a key's name, "address <ip>" without keys, "" for the
    pool used as a library. Parties of one class get turns in proportion to `weight`."""
    priority: Priority = Priority.NORMAL
    weight: int = 1


DEFAULT_SCHEDULE = Schedule()

INTERNAL_CALLER = "modelpool.internal_caller"
"""An ASGI scope's entry holding the `InternalCall` a request made inside the server acts
for (a batch's line, run through the app as the key that made the batch). Only the
server's own code builds such scopes: an HTTP server never puts this key in a client's."""


@dataclass(frozen=True)
class InternalCall:
    """Who a request made inside the server acts for, and where it queues."""

    owner: Owner
    schedule: Schedule

_OWNER = "owner"
"""The scope state's entry naming the caller's `Owner` (set by `acting_for`)."""
_CALLER: ContextVar[Owner | None] = ContextVar("modelpool_caller", default=None)
"""The caller of the request being served (set around it by `acting_for`), for code that
sees a request's body but not the request (`PoolFields.call_options`)."""
_SCHEDULE: ContextVar[Schedule] = ContextVar("modelpool_schedule", default=DEFAULT_SCHEDULE)
"""The caller's place in the queues (set around a request by `acting_for`), read by
`pool_api.CallOptions` when it is built inside the request."""


@contextmanager
def acting_for(
    scope: MutableMapping[str, Any], owner: Owner | None, schedule: Schedule = DEFAULT_SCHEDULE
) -> Iterator[None]:
    """Serve one request as `owner` (None: a caller keys are on for and who brought no valid
    key): its scope names them, and so does `caller_is_admin` while it runs; its requests
    queue as `schedule` says (`caller_schedule`)."""
    if owner is not None:
        scope.setdefault("state", {})[_OWNER] = owner
    token = _CALLER.set(owner)
    queued = _SCHEDULE.set(schedule)
    try:
        yield
    finally:
        _SCHEDULE.reset(queued)
        _CALLER.reset(token)


def caller_schedule() -> Schedule:
    """The queue class and fair-share party of the request being served (outside a request:
    the library's default, one party of normal priority)."""
    return _SCHEDULE.get()


def caller_is_admin() -> bool:
    """Whether the request being served holds the admin scope (any caller of a server
    without keys does; outside a request checked by `RequireKeys`, nobody does). For what
    a request body asks that only an admin may: a `keep_alive` that unloads sooner."""
    owner = _CALLER.get()
    return owner is not None and owner.admin


def is_keyless_caller(scope: Mapping[str, Any]) -> bool:
    """Keys are configured and this request brought none that is valid: open routes tell
    such a caller states, never details (engine output, upstream URLs, model lists)."""
    return not isinstance(scope.get("state", {}).get(_OWNER), Owner)


def owner_of(scope: Mapping[str, Any]) -> Owner:
    """Whose key made this request (what it stores is theirs; it reads only what it may).
    A path `RequireKeys` did not check while keys are on has no owner: refused."""
    owner = scope.get("state", {}).get(_OWNER)
    if not isinstance(owner, Owner):
        raise PermissionDenied("This route does not identify its caller.")
    return owner
