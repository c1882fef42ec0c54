"""Caps on the sizes a client controls inside a request body (JSON schemas, tool count,
`chat_template_kwargs`), checked before any work is done on them, and the off-loop step
that turns a body into a pool request under those caps.

The measuring walk stops at the first cap it passes, so refusing a 16 MiB schema costs
what measuring the allowed size costs, not what the schema would.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from modelpool.config.schema import ServerConfig
from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.offload import REQUEST_CHECKS, all_or_none
from modelpool.tools.metaschema import problem_of

T = TypeVar("T")
_DEFAULTS = ServerConfig()


@dataclass(frozen=True)
class BodyLimits:
    """The server's caps on one request's schemas, tools and template variables."""

    schema_bytes: int = _DEFAULTS.max_schema_bytes
    schema_nodes: int = _DEFAULTS.max_schema_nodes
    schema_depth: int = _DEFAULTS.max_schema_depth
    tools: int = _DEFAULTS.max_tools
    template_kwargs_bytes: int = _DEFAULTS.max_template_kwargs_bytes

    @classmethod
    def of(cls, server: ServerConfig) -> BodyLimits:
        return cls(server.max_schema_bytes, server.max_schema_nodes, server.max_schema_depth, server.max_tools,
                   server.max_template_kwargs_bytes)  # fmt: skip


class SizeBudget:
    """What is left of one allowance (bytes, values, depth) as JSON values are charged to it.
    One budget is shared by all the schemas of a request, so 128 tools at the per-schema
    size are not 128 times the allowance."""

    def __init__(self, max_bytes: int, max_nodes: int, max_depth: int, *, what: str, bytes_field: str) -> None:
        self.max_bytes, self.max_nodes, self.max_depth = max_bytes, max_nodes, max_depth
        self.bytes = self.nodes = 0
        self._what, self._bytes_field = what, bytes_field

    def charge(self, value: Any, param: str) -> None:
        """Count `value` (a parsed JSON value) against the allowance; over it → 413 naming the
        limit and `param`. Iterative, and it stops at the first value past a cap."""
        stack: list[tuple[Any, int]] = [(value, 1)]
        self._count(value, param)
        while stack:
            item, depth = stack.pop()
            if isinstance(item, dict | list) and depth > self.max_depth:
                raise RequestTooLarge(f"the {self._what} is nested deeper than {self.max_depth} levels "
                                      "(server.max_schema_depth)", param=param)  # fmt: skip
            children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
            for key, child in children:
                self.bytes += len(key) + 4 if isinstance(key, str) else 1  # "key": and a comma
                self._count(child, param)
                stack.append((child, depth + 1))

    def _count(self, value: Any, param: str) -> None:
        self.nodes += 1
        self.bytes += len(value) + 2 if isinstance(value, str) else 2 if isinstance(value, dict | list) else 5
        if self.nodes > self.max_nodes:
            raise RequestTooLarge(f"the {self._what} has more than {self.max_nodes} JSON values "
                                  "(server.max_schema_nodes)", param=param)  # fmt: skip
        if self.bytes > self.max_bytes:
            raise RequestTooLarge(f"the {self._what} is over {self.max_bytes} bytes (server.{self._bytes_field})",
                                  param=param)  # fmt: skip


@dataclass
class _Translation:
    """One body's translation: its caps, what is left of its schema allowance, and the
    metaschema checks left for `translated` to await."""

    limits: BodyLimits
    budget: SizeBudget
    deferred: list[tuple[str, str]] = field(default_factory=list)
    """(schema as JSON text, the field that holds it)."""


_TRANSLATION: contextvars.ContextVar[_Translation | None] = contextvars.ContextVar("translation", default=None)


def current_limits() -> BodyLimits:
    """The caps of the request being translated (the defaults outside `translated`)."""
    translation = _TRANSLATION.get()
    return translation.limits if translation is not None else BodyLimits()


def schema_budget() -> SizeBudget:
    """The schema allowance of the request being translated: shared by all its schemas
    inside `translated`, a fresh one per schema outside it."""
    translation = _TRANSLATION.get()
    return translation.budget if translation is not None else new_schema_budget(BodyLimits())


def defer_metaschema_check(text: str, param: str) -> bool:
    """Leave a schema's metaschema check to `translated` (False outside it: check it now)."""
    translation = _TRANSLATION.get()
    if translation is None:
        return False
    translation.deferred.append((text, param))
    return True


def new_schema_budget(limits: BodyLimits) -> SizeBudget:
    return SizeBudget(limits.schema_bytes, limits.schema_nodes, limits.schema_depth,
                      what="request's JSON schema", bytes_field="max_schema_bytes")  # fmt: skip


def charge_template_kwargs(kwargs: dict[str, Any], param: str) -> None:
    limits = current_limits()
    budget = SizeBudget(limits.template_kwargs_bytes, limits.schema_nodes, limits.schema_depth,
                        what="chat_template_kwargs", bytes_field="max_template_kwargs_bytes")  # fmt: skip
    budget.charge(kwargs, param)


async def translated(limits: BodyLimits, build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`build(*args, **kwargs)` — a body's `to_request` — off the event loop, under `limits`:
    on the bounded request-check threads, where its schemas are measured against one shared
    allowance; then their metaschema checks, awaited here while child processes run them
    (no thread waits on them, so a body without schemas never queues behind one with). The
    first schema found wrong cancels the checks of the others."""
    translation = _Translation(limits, new_schema_budget(limits))

    def job() -> T:
        _TRANSLATION.set(translation)  # the executor runs each job in a copy of the context
        return build(*args, **kwargs)

    result = await REQUEST_CHECKS.run(job)
    await all_or_none(translation.deferred, _metaschema_checked)
    return result


async def _metaschema_checked(deferred: tuple[str, str]) -> None:
    text, param = deferred
    problem = await problem_of(text)
    if problem is not None:
        raise InvalidRequest(problem, param=param)
