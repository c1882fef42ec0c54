"""Render chat messages with the model's own Jinja chat template (from the GGUF metadata),
the way Hugging Face tokenizers do: sandboxed, trim_blocks/lstrip_blocks, bos/eos names."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modelpool.errors import InvalidRequest


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        # Jinja's own tojson escapes <, >, & and ' for HTML; templates written for Hugging
        # Face expect plain JSON (tool schemas would otherwise reach the model as \u003c).
        env.filters["tojson"] = _tojson
        self.source = source
        self._template = env.from_string(source)
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """`messages` and `tools` in the Hugging Face layout (see tools/prompt.py); without
        `add_generation_prompt` the assistant's opening is left out (POST /tokenize)."""
        try:
            # The request's variables cannot replace the ones the template is rendered with.
            variables = {
                **template_kwargs,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": add_generation_prompt,
                "bos_token": self._bos_token,
                "eos_token": self._eos_token,
            }
            return self._template.render(**variables)
        except TemplateError as exc:
            raise InvalidRequest(f"the model's chat template rejected these messages: {exc}", param="messages") from exc


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
