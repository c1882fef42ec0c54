"""POST /tokenize and /detokenize, in vLLM's shapes and llama-server's: their bodies and replies.

/tokenize tells the shapes apart by the field that holds the input: `prompt` (vLLM's text),
`messages` (vLLM's chat) or `content` (llama-server's text). /detokenize bodies look alike
in both (`tokens`, and vLLM's `model`), so its answer carries both servers' field.
`model` may be left out only when one model in the pool has a tokenizer (llama-server has
no model field: it serves one model).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, field_validator

from modelpool.inference import TokenPiece
from modelpool.pool_api.results import Tokenized, TokenizeJob
from modelpool.wire.common import MAX_MESSAGES, PoolFields, TemplateKwargs, Text
from modelpool.wire.openai.chat import ChatCompletionBody, Message
from modelpool.wire.tools import ChatTool

_INPUTS = ("prompt", "messages", "content")


class TokenizeFields(PoolFields):
    model: str | None = Field(default=None, min_length=1)
    """The model whose tokenizer to use (optional when only one model has a tokenizer)."""


class VllmTokenizeText(TokenizeFields):
    prompt: Text
    add_special_tokens: bool = True
    return_token_strs: bool | None = False

    def job(self) -> TokenizeJob:
        pieces = "return_token_strs" if self.return_token_strs else None
        return TokenizeJob(text=self.prompt, add_special_tokens=self.add_special_tokens, pieces_param=pieces)


class VllmTokenizeChat(TokenizeFields):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    chat_template_kwargs: TemplateKwargs | None = None

    @field_validator("continue_final_message")
    @classmethod
    def _no_continuation(cls, value: bool) -> bool:
        if value:
            raise ValueError("continuing the final message is not supported; leave out continue_final_message")
        return value

    @field_validator("add_special_tokens")
    @classmethod
    def _template_places_specials(cls, value: bool) -> bool:
        if value:
            raise ValueError("the chat template places the special tokens; leave out add_special_tokens")
        return value

    def job(self) -> TokenizeJob:
        # The chat endpoint's own conversion, so a chat is tokenized exactly as it is served.
        body = ChatCompletionBody(model=self.model or "-", messages=self.messages, tools=self.tools,
                                  chat_template_kwargs=self.chat_template_kwargs)  # fmt: skip
        chat = body.to_request()
        pieces = "return_token_strs" if self.return_token_strs else None
        return TokenizeJob(chat=chat, add_generation_prompt=self.add_generation_prompt, pieces_param=pieces)


class LlamaTokenize(TokenizeFields):
    content: Text
    add_special: bool = False
    parse_special: bool = Field(default=True, json_schema_extra={"const": True})
    with_pieces: bool = False

    @field_validator("parse_special")
    @classmethod
    def _specials_parsed(cls, value: bool) -> bool:
        if not value:
            raise ValueError("special-token text is always read as the special token; leave out parse_special")
        return value

    def job(self) -> TokenizeJob:
        pieces = "with_pieces" if self.with_pieces else None
        return TokenizeJob(text=self.content, add_special_tokens=self.add_special, pieces_param=pieces)


def _shape(body: Any) -> str | None:
    """The shape tag (capitalised, so error locations skip it). No input field: vLLM's text
    shape, whose error names the missing `prompt`; several: None, an error naming them."""
    if not isinstance(body, dict):
        return None
    given = [name for name in _INPUTS if name in body]
    if len(given) > 1:
        return None
    return (given or ["prompt"])[0].capitalize()


TokenizeBody = Annotated[
    Annotated[VllmTokenizeText, Tag("Prompt")]
    | Annotated[VllmTokenizeChat, Tag("Messages")]
    | Annotated[LlamaTokenize, Tag("Content")],
    Discriminator(
        _shape,
        custom_error_type="invalid_shape",
        custom_error_message="send exactly one of `prompt` (text), `messages` (a chat) or `content` "
        "(llama-server's text)",
    ),
]


MAX_DETOKENIZE = 1_000_000
"""Ids per /detokenize request: far past any context, short of a body that blocks a tokenizer for seconds."""


class DetokenizeBody(TokenizeFields):
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE)


def vllm_tokens(result: Tokenized) -> dict[str, Any]:
    strs = None if result.pieces is None else [piece.spelling for piece in result.pieces]
    return {"count": len(result.ids), "max_model_len": result.max_model_len, "tokens": result.ids, "token_strs": strs}


def llama_server_tokens(result: Tokenized) -> dict[str, Any]:
    if result.pieces is None:
        return {"tokens": result.ids}
    return {"tokens": [{"id": piece.id, "piece": _piece(piece)} for piece in result.pieces]}


def _piece(piece: TokenPiece) -> str | list[int]:
    """llama-server's rule: the piece as a string when it is valid UTF-8, else its bytes."""
    try:
        return piece.data.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece.data)
