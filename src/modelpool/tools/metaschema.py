"""The JSON-schema metaschema check of a request's schema. It is pure Python, ~0.1 ms a
subschema, and in a thread it would still take the interpreter lock from the event loop,
so it runs in child processes (`offload.SCHEMA_CHECKS`), as a function of text alone.
Results are remembered by the schema's text: agents send the same tools every turn."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from modelpool.offload import SCHEMA_CHECKS

REMEMBERED = 64
"""Schema texts whose verdict is kept (least recently used go first)."""


def metaschema_problem(text: str) -> str | None:
    """What is wrong with a JSON schema given as JSON text (None: nothing), checked against
    the metaschema of its draft (2020-12 when `$schema` does not say). Runs in a child."""
    from jsonschema import SchemaError, validators

    schema = json.loads(text)
    if not isinstance(schema.get("$schema", ""), str):
        return "`$schema` must be a string (a metaschema URI)"
    validator = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except RecursionError:
        return "the JSON schema is nested too deeply"
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"not a valid JSON schema{f' at {where}' if where else ''}: {exc.message}"
    return None


class _Verdicts:
    """The verdicts of recently checked schema texts, shared by every thread."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._known: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[bool, str | None]:
        with self._lock:
            if text not in self._known:
                return False, None
            self._known.move_to_end(text)
            return True, self._known[text]

    def put(self, text: str, problem: str | None) -> None:
        with self._lock:
            self._known[text] = problem
            while len(self._known) > self._size:
                self._known.popitem(last=False)


_VERDICTS = _Verdicts(REMEMBERED)


def problem_now(text: str) -> str | None:
    """The schema's problem, waiting here for a child to check it (from a thread only)."""
    known, problem = _VERDICTS.get(text)
    if not known:
        problem = SCHEMA_CHECKS.call(metaschema_problem, text)
        _VERDICTS.put(text, problem)
    return problem


async def problem_of(text: str) -> str | None:
    """The schema's problem, awaited while a child checks it (from the event loop)."""
    known, problem = _VERDICTS.get(text)
    if not known:
        problem = await SCHEMA_CHECKS.run(metaschema_problem, text)
        _VERDICTS.put(text, problem)
    return problem
