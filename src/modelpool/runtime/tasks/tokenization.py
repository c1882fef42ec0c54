"""POST /tokenize and /detokenize as a library: whose tokenizer a request uses, and what it
asks of it. The pool leases the model (loading it if need be, as vLLM must have it loaded
too) and runs these on that turn."""

from __future__ import annotations

from modelpool.backends.base import TokenizerBackend
from modelpool.errors import InvalidRequest
from modelpool.inference import ChatRequest
from modelpool.pool_api.results import Tokenized, TokenizeJob
from modelpool.runtime.slot import ModelSlot


def tokenizer_slot(slots: list[ModelSlot], named: ModelSlot | None) -> ModelSlot:
    """The model whose tokenizer a request uses: the one it names, or, when it names none
    (llama-server's requests have no `model`), the only model that has a tokenizer."""
    if named is None:
        able = [slot for slot in slots if slot.capabilities.declared.tokenizer]
        if len(able) != 1:
            names = ", ".join(slot.id for slot in able) or "none"
            raise InvalidRequest(
                f"name the model whose tokenizer to use in `model` (models with a tokenizer: {names})", param="model"
            )
        return able[0]
    if named.capabilities.declared.tokenizer:
        return named
    if named.capabilities.remote:
        why = "it is served by a remote upstream, and its tokenizer is not here"
    else:
        why = f"its backend ('{named.config.backend}') has no tokenizer modelpool can use"
    raise InvalidRequest(f"model '{named.id}' cannot tokenize: {why}", param="model")


async def tokenize_on(model: str, backend: TokenizerBackend, job: TokenizeJob) -> Tokenized:
    if job.chat is not None:
        _check_text_only(job.chat)
        ids = await backend.encode_chat(job.chat, job.add_generation_prompt)
    else:
        assert job.text is not None, "a job holds text or a chat"
        ids = await backend.encode_text(job.text, job.add_special_tokens)
    pieces = None
    if job.pieces_param is not None:
        pieces = await backend.token_pieces(ids)
        if pieces is None:
            raise InvalidRequest(f"model '{model}' cannot tell token pieces (its engine does not say them); "
                                 f"leave out `{job.pieces_param}`", param=job.pieces_param)  # fmt: skip
    return Tokenized(model, ids, await backend.max_model_len(), pieces)


def _check_text_only(chat: ChatRequest) -> None:
    """An image's tokens come from the model's projector at generation time, not from its tokenizer."""
    for index, message in enumerate(chat.messages):
        if message.parts:  # images or videos
            raise InvalidRequest("only text messages can be tokenized", param=f"messages[{index}].content")
