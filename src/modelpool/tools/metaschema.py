"""The JSON-schema metaschema check of a request's schema. A function of text alone, so it
can run in a child process (`offload.SCHEMA_CHECKS`): the check is pure Python, ~0.1 ms a
subschema, and in a thread it would still take the interpreter lock from the event loop."""

from __future__ import annotations

import json


def metaschema_problem(text: str) -> str | None:
    """What is wrong with a JSON schema given as JSON text (None: nothing), checked against
    the metaschema of its draft (2020-12 when `$schema` does not say)."""
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
