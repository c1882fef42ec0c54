"""MCP tools over the pool: list_models, chat, embed, rerank, transcribe, speak.

Each tool builds the same wire body the HTTP route validates (ChatCompletionBody,
EmbeddingsBody, ...) and calls the pool as that route does, so a request means the same
over MCP as over HTTP, with the same checks and the same errors.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import AudioContent, CallToolResult
from pydantic import BaseModel, Field

from modelpool.audio.encode import MEDIA_TYPES, AudioEncoder, require_encoder
from modelpool.config.schema import ServerConfig
from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.inference import TranscriptionRequest
from modelpool.mcp_server.audio_input import read_audio
from modelpool.mcp_server.transcript_tools import caller_of
from modelpool.mcp_server.transcripts import TranscriptStore
from modelpool.pool_api import PoolApi, PoolRequests, PoolStatus
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.generation import collect
from modelpool.pool_api.results import SpeechAudio, charge
from modelpool.pool_api.results import charged as charged_to
from modelpool.pool_api.usage import USAGE_METER, UsageMeter
from modelpool.wire.openai.chat import ChatCompletionBody
from modelpool.wire.openai.embeddings import EmbeddingsBody
from modelpool.wire.openai.models import model_json
from modelpool.wire.openai.rerank import RerankBody
from modelpool.wire.openai.speech import AudioFormat, SpeechBody

Model = Annotated[str, Field(description="A model id or alias (see list_models)")]
AllowRemote = Annotated[bool, Field(description="Accept a remote upstream serving this model")]
AudioBase64 = Annotated[str | None, Field(description="The audio file's bytes, base64 (or a data: URI)")]
AudioPath = Annotated[str | None, Field(description="An audio file under server.allowed_local_media_dirs")]
TranscriptSource = Annotated[
    str | None, Field(description="Also add the segments to the transcript store under this source id")
]
TranscriptStart = Annotated[
    float, Field(description="Added to the segments' times when stored: the source's clock at the audio's start")
]
ImageUrl = Annotated[
    str | None,
    Field(
        min_length=1,
        description="An image for the last (user) turn, as an HTTP chat request's image_url part takes it: "
        "a data: URI, an http(s) URL (when the server allows remote images) or a file:// URL under "
        "server.allowed_local_media_dirs. The model must take images (capabilities.modalities).",
    ),
]
Deterministic = Annotated[bool, Field(description="No sampling noise: the same text gives the same audio")]


class ChatTurn(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class ChatReply(BaseModel):
    model: str
    text: str
    reasoning: str = ""
    finish_reason: str
    usage: Usage


class Embeddings(BaseModel):
    model: str
    dimensions: int
    embeddings: list[list[float]]
    prompt_tokens: int


class Ranked(BaseModel):
    index: int
    relevance_score: float
    document: str


class Reranking(BaseModel):
    model: str
    results: list[Ranked]
    """Best first."""


class TimedText(BaseModel):
    start: float
    end: float
    text: str


class Transcript(BaseModel):
    model: str
    text: str
    language: str
    duration_s: float
    segments: list[TimedText]
    stored_under: str | None = None
    """The transcript source its segments were added to, if any."""


class ModelList(BaseModel):
    models: list[dict[str, Any]]
    """As GET /v1/models lists them: id, state, tasks, aliases, capabilities, ..."""


T = TypeVar("T")


def meter_of(ctx: Context[Any, Any]) -> UsageMeter | None:
    """The usage meter of the HTTP request that carried the MCP call (set by the rate-limit layer)."""
    request = ctx.request_context.request
    meter: UsageMeter | None = None if request is None else request.scope.get("state", {}).get(USAGE_METER)
    return meter


def charged(ctx: Context[Any, Any], result: T) -> T:
    """`result` of a pool call (a stream), its usage charged to the caller of the MCP call."""
    charge(meter_of(ctx), result)
    return result


async def charged_call(ctx: Context[Any, Any], work: Awaitable[T]) -> T:
    """The result of a whole pool call, what it used (or used before failing) charged to the
    caller of the MCP call."""
    return await charged_to(meter_of(ctx), work)


def add_pool_tools(server: MCPServer[Any], pool: PoolApi, store: TranscriptStore, config: ServerConfig) -> None:
    # The tools take no keep_alive, so their callers have nothing to shorten: call_options().
    tools = (_list_models_tool(pool), _chat_tool(pool), _embed_tool(pool), _rerank_tool(pool),
             _transcribe_tool(pool, store, config), _speak_tool(pool))  # fmt: skip
    for tool in tools:
        server.add_tool(tool)


def _list_models_tool(pool: PoolStatus) -> Callable[..., Awaitable[Any]]:
    async def list_models() -> ModelList:
        """Every model this server serves, with its state, tasks and capabilities."""
        return ModelList(models=[model_json(status) for status in pool.statuses()])

    return list_models


def _chat_tool(pool: PoolRequests) -> Callable[..., Awaitable[Any]]:
    async def chat(
        model: Model,
        ctx: Context[Any, Any],
        messages: Annotated[list[ChatTurn], Field(min_length=1)],
        max_tokens: Annotated[int | None, Field(ge=1)] = None,
        temperature: Annotated[float | None, Field(ge=0, le=2)] = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        allow_remote: AllowRemote = False,
        image_url: ImageUrl = None,
    ) -> ChatReply:
        """A chat model's reply to `messages`; with `image_url`, about that image (a vision model)."""
        fields = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stop": stop}
        body = ChatCompletionBody.model_validate({
            "model": model, "messages": _wire_turns(messages, image_url), "allow_remote": allow_remote,
            **{name: value for name, value in fields.items() if value is not None},
        })  # fmt: skip
        request = body.to_request()
        stream = charged(ctx, await pool.chat(model, request, body.call_options()))
        async with stream:
            generation = await collect(stream)
        usage = Usage(prompt_tokens=generation.usage.prompt_tokens,
                      completion_tokens=generation.usage.completion_tokens)  # fmt: skip
        return ChatReply(model=stream.model_id, text=generation.text, reasoning=generation.reasoning,
                         finish_reason=generation.finish_reason, usage=usage)  # fmt: skip

    return chat


def _wire_turns(messages: list[ChatTurn], image_url: str | None) -> list[dict[str, Any]]:
    """The turns as a chat request's `messages`, the image (if any) a part of the last one,
    which must be the user's: from there the pool loads and checks it as for HTTP."""
    turns: list[dict[str, Any]] = [turn.model_dump() for turn in messages]
    if image_url is None:
        return turns
    if turns[-1]["role"] != "user":
        raise InvalidRequest("image_url goes with the last turn, which must be the user's", param="image_url")
    text = turns[-1]["content"]
    parts = [{"type": "text", "text": text}] if text else []
    turns[-1] = {"role": "user", "content": [*parts, {"type": "image_url", "image_url": {"url": image_url}}]}
    return turns


def _embed_tool(pool: PoolApi) -> Callable[..., Awaitable[Any]]:
    async def embed(
        model: Model,
        input: Annotated[list[str], Field(min_length=1)],
        ctx: Context[Any, Any],
        allow_remote: AllowRemote = False,
    ) -> Embeddings:
        """One embedding vector per input text, in order."""
        body = EmbeddingsBody.model_validate({"model": model, "input": input, "allow_remote": allow_remote})
        result = (await charged_call(ctx, pool.embed(model, body.to_request(), body.call_options()))).value
        vectors: list[list[float]] = result.vectors.tolist()
        return Embeddings(model=pool.model_id(model), dimensions=result.vectors.shape[1], embeddings=vectors,
                          prompt_tokens=result.prompt_tokens)  # fmt: skip

    return embed


def _rerank_tool(pool: PoolApi) -> Callable[..., Awaitable[Any]]:
    async def rerank(
        model: Model,
        query: str,
        documents: Annotated[list[str], Field(min_length=1)],
        ctx: Context[Any, Any],
        top_n: Annotated[int | None, Field(ge=1, description="Keep the best this many (default: all)")] = None,
        allow_remote: AllowRemote = False,
    ) -> Reranking:
        """The documents ordered by relevance to the query (a reranker, or an embedding
        model's cosine similarity)."""
        body = RerankBody.model_validate({"model": model, "query": query, "documents": documents,
                                          "top_n": top_n, "allow_remote": allow_remote})  # fmt: skip
        scores = (await charged_call(ctx, pool.score_pairs(model, body.to_request(), body.call_options()))).value
        ranked = sorted(range(len(documents)), key=lambda i: scores.scores[i], reverse=True)
        results = [Ranked(index=i, relevance_score=scores.scores[i], document=documents[i]) for i in ranked]
        return Reranking(model=pool.model_id(model), results=results[:top_n] if top_n else results)

    return rerank


def _transcribe_tool(pool: PoolRequests, store: TranscriptStore, config: ServerConfig) -> Callable[..., Awaitable[Any]]:
    async def transcribe(
        model: Model,
        ctx: Context[Any, Any],
        audio_base64: AudioBase64 = None,
        path: AudioPath = None,
        language: str | None = None,
        prompt: str | None = None,
        transcript_source: TranscriptSource = None,
        transcript_start: TranscriptStart = 0.0,
        allow_remote: AllowRemote = False,
    ) -> Transcript:
        """Speech to text, with timed segments. Give the audio as `audio_base64` or `path`."""
        upload = await read_audio(audio_base64, path, config)
        job = TranscriptionRequest(language=language, prompt=prompt)
        try:
            options = CallOptions(allow_remote=allow_remote)
            transcription = charged(ctx, await pool.transcribe(model, upload, job, options))
        except (InvalidRequest, RequestTooLarge) as exc:  # bad audio, or audio too long
            if exc.param == "file":  # the HTTP route's name for the audio: name this tool's
                exc.param = "path" if path is not None else "audio_base64"
            raise
        async with transcription.segments as stream:
            segments = [segment async for segment in stream]
        if transcript_source is not None:  # a file append: off the event loop
            await asyncio.to_thread(store.add_segments, transcript_source, segments, transcript_start, caller_of(ctx))
        return Transcript(
            model=transcription.segments.model_id,
            text="".join(s.text for s in segments).strip(),
            language=segments[0].language if segments else (language or "en"),
            duration_s=round(transcription.audio_seconds, 3),
            segments=[TimedText(start=s.start, end=s.end, text=s.text) for s in segments],
            stored_under=transcript_source,
        )

    return transcribe


def _speak_tool(pool: PoolRequests) -> Callable[..., Awaitable[Any]]:
    async def speak(
        model: Model,
        text: Annotated[str, Field(min_length=1, pattern=r"\S")],
        ctx: Context[Any, Any],
        voice: str | None = None,
        format: AudioFormat = "wav",
        speed: Annotated[float, Field(ge=0.25, le=4.0)] = 1.0,
        deterministic: Deterministic = False,
        allow_remote: AllowRemote = False,
    ) -> CallToolResult:
        """Text to speech: the audio as base64 (an audio content block), with its format
        and length as structured content."""
        body = SpeechBody.model_validate({"model": model, "input": text, "voice": voice, "response_format": format,
                                          "speed": speed, "deterministic": deterministic,
                                          "allow_remote": allow_remote})  # fmt: skip
        require_encoder(format)
        audio = charged(ctx, await pool.speak(model, body.to_request(), body.call_options()))
        data, samples = await _encoded(audio, format)
        about = {"model": audio.chunks.model_id, "format": format, "media_type": MEDIA_TYPES[format],
                 "sample_rate": audio.sample_rate, "duration_s": round(samples / audio.sample_rate, 3),
                 "bytes": len(data)}  # fmt: skip
        content = AudioContent(data=base64.b64encode(data).decode("ascii"), mime_type=MEDIA_TYPES[format])
        return CallToolResult(content=[content], structured_content=about)

    return speak


async def _encoded(audio: SpeechAudio, response_format: str) -> tuple[bytes, int]:
    """The whole audio file, and how many samples it holds."""
    encoder, parts, samples = AudioEncoder(response_format, audio.sample_rate), list[bytes](), 0
    async with audio.chunks as chunks:
        async for pcm in chunks:
            samples += len(pcm)
            parts.append(encoder.encode(pcm))
    data = b"".join([*parts, encoder.finish()])
    return (_sized_wav(data) if response_format == "wav" else data), samples


def _sized_wav(data: bytes) -> bytes:
    """The encoder streams WAV with its sizes unknown (all ones); a whole file gets the real
    ones, which every reader accepts."""
    riff, chunk = len(data) - 8, len(data) - 44
    return data[:4] + riff.to_bytes(4, "little") + data[8:40] + chunk.to_bytes(4, "little") + data[44:]
