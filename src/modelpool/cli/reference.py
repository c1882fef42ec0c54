"""The config reference in Markdown, generated from the typed config and backend options,
so docs/configuration.md can never drift from the code (a test compares them).

Every section of the config is found by walking the models' fields, so a section added to
the schema (a new `pool:` limit, a `ray:` sub-table) appears here without a list to keep."""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from modelpool.backends.registry import BACKENDS, backend_class
from modelpool.config.schema import Config, ModelConfig

START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"
# What a mapping's key stands for in a section's path (`models: <id>:`); other mappings: <name>.
_KEY_NAMES = {"models": "<id>"}


def reference_markdown() -> str:
    sections = list(_sections([], Config, set()))
    sections += [(f"`options:` of backend `{name}`", backend_class(name).Options) for name in BACKENDS]
    return "\n\n".join(_table(title, model) for title, model in sections) + "\n"


def splice_into(document: str, reference: str) -> str:
    """`document` with the text between the START and END markers replaced by `reference`."""
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference}{END}{tail}"


Section = tuple[str, type[BaseModel]]
"""A table's title and the model whose fields it lists."""


def _sections(path: list[str], model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[Section]:
    """`model`'s own table, then each nested section depth first. A model met again under
    another path (the Ray actor options of a model, of a group, of the ingress) is listed
    once, where it first appears: its type name in the other tables points to it."""
    seen.add(model)
    yield ("Top level" if not path else "`" + ": ".join(path) + ":`"), model
    for name, field in model.model_fields.items():
        for key, nested in _nested_models(field.annotation):
            if nested not in seen:
                step = [name] + ([_KEY_NAMES.get(name, "<name>")] if key == "dict" else [])
                step[-1] += "[]" if key == "list" else ""
                yield from _sections(path + step, nested, seen)


def _nested_models(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The config sections an annotation holds: ("", M) for `M` or `M | None`, ("dict", M)
    for `dict[str, M]`, ("list", M) for `list[M]`."""
    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
    elif origin in (Union, types.UnionType):
        for arm in get_args(annotation):
            yield from _nested_models(arm)
    elif origin in (dict, list):
        inner = get_args(annotation)[-1]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield ("dict" if origin is dict else "list"), inner


def _table(title: str, model: type[BaseModel]) -> str:
    rows = [f"### {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name == "id" and model is ModelConfig:
            continue  # taken from the key
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
    return "\n".join(rows)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not hasattr(annotation, "__args__") else None
    text = text or str(annotation)
    text = re.sub(r"\b(?:typing|pathlib|modelpool\.[\w.]+)\.", "", text)
    text = re.sub(r"<(?:class|enum) '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return "`" + text.replace("|", "\\|") + "`"


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return f"`{value!r}`" if not isinstance(value, BaseModel) else "(section)"
    if field.default is PydanticUndefined:
        return "required"
    value = field.default.value if hasattr(field.default, "value") else field.default
    return f"`{value!r}`" if value is not None else "—"
