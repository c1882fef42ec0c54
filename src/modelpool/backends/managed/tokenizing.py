"""`TokenizerBackend` through an engine process's own tokenizer routes, which sit at the
engine's root, outside its OpenAI API: native llama-server's /tokenize, /detokenize and
/apply-template; vLLM's /tokenize and /detokenize. The engine tokenizes, so the ids are the
ones it generates from. Neither says a token's bytes for given ids: `token_pieces` is None."""

from __future__ import annotations

from typing import Any

from modelpool.backends.remote.client import UpstreamClient
from modelpool.backends.textgen.decoding import check_token_ids
from modelpool.config.schema import ModelConfig
from modelpool.errors import UpstreamError, UpstreamUnavailable
from modelpool.inference import ChatRequest, TokenPiece
from modelpool.wire.openai import upstream as openai_wire


class EngineTokenizer:
    """What both engines share: the root client, and reading their answers."""

    model: ModelConfig
    upstream_model: str
    engine_root: UpstreamClient | None = None

    def root(self) -> UpstreamClient:
        if self.engine_root is None:
            raise UpstreamUnavailable(f"model '{self.model.id}': its engine process is not running")
        return self.engine_root

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = await self.root().post_json(path, body)
        if not isinstance(payload, dict):
            raise UpstreamError(502, f"model '{self.model.id}': the engine's /{path} answered {str(payload)[:200]}")
        return payload

    def _ids(self, payload: dict[str, Any], path: str) -> list[int]:
        tokens = payload.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise UpstreamError(502, f"model '{self.model.id}': the engine's /{path} gave no token ids")
        return tokens


class LlamaServerTokenizer(EngineTokenizer):
    """Native llama-server's routes (llama_cpp.server has no such ones: its models declare no tokenizer)."""

    context_length: int = 0
    _vocabulary: int | None = None

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        body = {"content": text, "add_special": add_special_tokens, "parse_special": True}
        return self._ids(await self._post("tokenize", body), "tokenize")

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        body = {**openai_wire.chat_body(request, self.upstream_model), "add_generation_prompt": add_generation_prompt}
        prompt = (await self._post("apply-template", body)).get("prompt")
        if not isinstance(prompt, str):
            raise UpstreamError(502, f"model '{self.model.id}': the engine's /apply-template gave no prompt")
        # As llama-server tokenizes a chat's prompt: special tokens added as the model says.
        return await self.encode_text(prompt, True)

    async def decode_tokens(self, ids: list[int]) -> str:
        # Checked here: llama.cpp aborts on an id outside its vocabulary.
        check_token_ids(ids, await self._vocabulary_size(), "tokens")
        content = (await self._post("detokenize", {"tokens": ids})).get("content")
        return str(content)

    async def max_model_len(self) -> int | None:
        return self.context_length

    async def _vocabulary_size(self) -> int:
        if self._vocabulary is None:
            listed = await self.root().get_json("v1/models")
            try:
                self._vocabulary = int(listed["data"][0]["meta"]["n_vocab"])
            except (KeyError, IndexError, TypeError, ValueError):
                raise UpstreamError(502, f"model '{self.model.id}': the engine's /v1/models gave no n_vocab") from None
        return self._vocabulary


class VllmTokenizer(EngineTokenizer):
    """vLLM's routes. vLLM checks what it is sent itself (a chat its template refuses is a 400)."""

    _max_model_len: int | None = None

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        body = {"model": self.upstream_model, "prompt": text, "add_special_tokens": add_special_tokens}
        return await self._tokenize(body)

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        chat = openai_wire.chat_body(request, self.upstream_model)
        body: dict[str, Any] = {key: chat[key] for key in ("model", "messages", "tools", "chat_template_kwargs")
                                if key in chat}  # fmt: skip
        return await self._tokenize({**body, "add_generation_prompt": add_generation_prompt})

    async def decode_tokens(self, ids: list[int]) -> str:
        check_token_ids(ids, 1 << 31, "tokens")  # vLLM knows its vocabulary; negative ids are caught here
        payload = await self._post("detokenize", {"model": self.upstream_model, "tokens": ids})
        return str(payload.get("prompt", ""))

    async def max_model_len(self) -> int | None:
        return self._max_model_len

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        payload = await self._post("tokenize", body)
        limit = payload.get("max_model_len")
        self._max_model_len = limit if isinstance(limit, int) else self._max_model_len
        return self._ids(payload, "tokenize")
