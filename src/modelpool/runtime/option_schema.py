"""The options a model may change at load time, each with its JSON schema and current value,
so a client (the workbench's load form) can build an input per option and check its bounds
before it asks. The schema comes from the backend's own pydantic `Options`: one source of
truth for the config file, the load-time check and the form."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ValidationError

from modelpool.backends.managed.engine_flags import OVERRIDE_OF
from modelpool.backends.registry import backend_class, parse_options
from modelpool.config.redact import redact
from modelpool.config.schema import ModelConfig
from modelpool.errors import InvalidRequest
from modelpool.status import OverrideOption


def override_options(config: ModelConfig, names: frozenset[str]) -> list[OverrideOption]:
    """The overridable options of `config`'s backend, by name."""
    options_class = backend_class(config.backend).Options
    schemas = option_schemas(options_class)
    # Redacted at any depth, as the status's `options` are: a secret may sit inside a dict
    # option (`env: {HF_TOKEN: ...}`), not only under a secret-looking name of its own.
    current = redact(parse_options(config).model_dump(mode="json"))
    return [OverrideOption(name, schemas.get(name, {}), current.get(name)) for name in sorted(names)]


def check_override(configured: ModelConfig, candidate: ModelConfig) -> None:
    """Overrides cannot widen what the config allows: the backend's options validate the
    candidate knowing the configured ones (under `OVERRIDE_OF` in pydantic's validation
    context), so an option such as `extra_args` can refuse what only the config may set.
    InvalidRequest naming `overrides` (with the option's own reason) if it widens."""
    options_class = backend_class(candidate.backend).Options
    try:
        options_class.model_validate(candidate.options, context={OVERRIDE_OF: parse_options(configured)})
    except ValidationError as exc:
        reasons = "; ".join(str(e.get("ctx", {}).get("error", e["msg"])) for e in exc.errors())
        raise InvalidRequest(f"model '{candidate.id}': {reasons}", param="overrides") from None


@functools.cache
def option_schemas(options_class: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Each field's flattened schema (cached: a class's schema never changes). Callers must
    not mutate the dicts they get."""
    schema = options_class.model_json_schema()
    definitions = schema.get("$defs", {})
    return {name: flatten(field, definitions) for name, field in schema.get("properties", {}).items()}


def flatten(field: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """`field` with `$ref`s resolved and `anyOf: [X, null]` (pydantic's Optional) merged into
    X plus `nullable: true`. A real union of several types keeps its `anyOf`."""
    resolved = _resolve(field, definitions)
    choices = resolved.get("anyOf")
    if not isinstance(choices, list):
        return resolved
    kept = [_resolve(choice, definitions) for choice in choices if choice.get("type") != "null"]
    if len(kept) != 1:
        return resolved
    merged = {key: value for key, value in resolved.items() if key != "anyOf"}
    # The field's own title, default and description win over the inner type's.
    merged = {**kept[0], **merged}
    if len(kept) < len(choices):
        merged["nullable"] = True
    return merged


def _resolve(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref` (or pydantic's `allOf: [{$ref}]` wrapper), keeping sibling keys."""
    siblings = {key: value for key, value in schema.items() if key not in ("$ref", "allOf")}
    reference = schema.get("$ref")
    wrapped = schema.get("allOf")
    if reference is None and isinstance(wrapped, list) and len(wrapped) == 1:
        reference = wrapped[0].get("$ref")
    if not isinstance(reference, str) or not reference.startswith("#/$defs/"):
        return schema
    target = definitions.get(reference.removeprefix("#/$defs/"), {})
    return {**_resolve(target, definitions), **siblings}
