"""Text generation on a Hugging Face tokenizer: the chat rendered by its template and the
prompt encoded, as the transformers and CTranslate2 engines both need it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelpool.errors import InvalidRequest
from modelpool.tools.prompt import ChatPlan


def render_chat_text(
    renderer: Any,
    plan: ChatPlan,
    chat_template: str | None,
    template_kwargs: Mapping[str, Any],
    add_generation_prompt: bool = True,
) -> str:
    """The chat as text, by a tokenizer's or a processor's `apply_chat_template` (the same
    call on both); a template that refuses the messages is the request's fault."""
    from jinja2 import TemplateError

    try:
        text: str = renderer.apply_chat_template(
            plan.messages,
            tools=plan.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            **dict(template_kwargs),
        )
    except TemplateError as exc:
        raise InvalidRequest(f"the model's chat template rejected these messages: {exc}", param="messages") from exc
    return text


def chat_prompt_ids(
    tokenizer: Any,
    plan: ChatPlan,
    chat_template: str | None,
    template_kwargs: Mapping[str, Any],
    add_generation_prompt: bool = True,
) -> list[int]:
    """A text-only chat rendered by the tokenizer's (or the configured) template, as ids."""
    text = render_chat_text(tokenizer, plan, chat_template, template_kwargs, add_generation_prompt)
    return encode_text(tokenizer, text)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of text whose special tokens are written in it (a rendered template adds its own)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
