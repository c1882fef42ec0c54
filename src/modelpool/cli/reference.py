"""The config reference in Markdown, generated from the typed config and backend options,
so the README can never drift from the code (a test compares them)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from modelpool.backends.registry import BACKENDS, backend_class
from modelpool.config.schema import Config, ModelConfig, SamplingDefaults, ServerConfig

START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"


def reference_markdown() -> str:
    sections: list[tuple[str, type[BaseModel]]] = [
        ("Top level", Config),
        ("`server:`", ServerConfig),
        ("`models: <id>:`", ModelConfig),
        ("`models: <id>: sampling:`", SamplingDefaults),
    ]
    sections += [(f"`options:` of backend `{name}`", backend_class(name).Options) for name in BACKENDS]
    return "\n\n".join(_table(title, model) for title, model in sections) + "\n"


def splice_into(document: str, reference: str) -> str:
    """`document` with the text between the START and END markers replaced by `reference`."""
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference}{END}{tail}"


def _table(title: str, model: type[BaseModel]) -> str:
    rows = [f"#### {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
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
