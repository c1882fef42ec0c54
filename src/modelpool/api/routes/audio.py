"""The OpenAI audio API: transcriptions, translations, speech, and the voices list."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.sse import ClosingStreamingResponse, EventStreamResponse
from modelpool.api.transcripts import StoreTarget, subtitles, transcript_text, verbose_json
from modelpool.audio.encode import MEDIA_TYPES, AudioEncoder, require_encoder
from modelpool.errors import InvalidRequest
from modelpool.inference import Segment, TranscriptionRequest
from modelpool.owner import owner_of
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.streams import ResultStream
from modelpool.wire.contract import LISTING_ERRORS, MODEL_LIMITS, POOL_ERRORS, SSE, binary, declared, sse_events, text
from modelpool.wire.openai.speech import SpeechBody, encoded_speech, speech_events, transcript_events

router = APIRouter()
_SPEECH_MEDIA = {kind: binary() for kind in MEDIA_TYPES.values()}  # as `response_format` asks, or SSE
# A transcript is JSON, text or subtitles as `response_format` asks, or SSE with `stream`.
_TRANSCRIPT_MEDIA = {"text/plain": text(), "text/vtt": text(), "application/x-subrip": text()}
_TRANSCRIPT_RULES = (MODEL_LIMITS, "`file` is audio the server can decode",
                     "timestamp_granularities only with response_format verbose_json")
ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]


@router.post("/v1/audio/transcriptions", response_model=None,
             responses=declared(POOL_ERRORS, media={**_TRANSCRIPT_MEDIA, SSE: sse_events()},
                                rules=_TRANSCRIPT_RULES))  # fmt: skip
async def transcriptions(
    request: Request,
    file: Annotated[UploadFile, File()],
    model: Annotated[str, Form(min_length=1)],
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    timestamp_granularities: Annotated[
        list[Literal["segment", "word"]] | None, Form(alias="timestamp_granularities[]")
    ] = None,
    stream: Annotated[bool, Form()] = False,
    allow_remote: Annotated[bool, Form()] = False,
    transcript_source: Annotated[str | None, Form(min_length=1, max_length=256)] = None,
    transcript_start: Annotated[float, Form(allow_inf_nan=False)] = 0.0,
) -> Response:
    granularities = set(timestamp_granularities or [])
    if granularities and response_format != "verbose_json":
        raise InvalidRequest(
            "timestamp_granularities needs response_format=verbose_json", param="timestamp_granularities"
        )
    return await _transcribe(request, file, model, "transcribe", response_format, stream,
                             language=language, prompt=prompt, temperature=temperature,
                             words="word" in granularities, allow_remote=allow_remote,
                             store=_store_target(request, transcript_source, transcript_start))  # fmt: skip


def _store_target(request: Request, source: str | None, start: float) -> StoreTarget | None:
    """modelpool extension: `transcript_source` also adds the segments to the transcript
    store (the MCP server's), `transcript_start` shifting their times."""
    if source is None:
        return None
    return StoreTarget(request.app.state.transcripts, source, start, owner_of(request.scope))


@router.post("/v1/audio/translations", response_model=None,
             responses=declared(POOL_ERRORS, media=_TRANSCRIPT_MEDIA, rules=_TRANSCRIPT_RULES))  # fmt: skip
async def translations(
    request: Request,
    file: Annotated[UploadFile, File()],
    model: Annotated[str, Form(min_length=1)],
    prompt: Annotated[str | None, Form()] = None,
    temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    allow_remote: Annotated[bool, Form()] = False,
) -> Response:
    return await _transcribe(request, file, model, "translate", response_format, False,
                             language=None, prompt=prompt, temperature=temperature, words=False,
                             allow_remote=allow_remote, store=None)  # fmt: skip


async def _transcribe(
    request: Request, file: UploadFile, model: str, task: str, response_format: str, stream: bool, *,
    language: str | None, prompt: str | None, temperature: float, words: bool, allow_remote: bool,
    store: StoreTarget | None,
) -> Response:  # fmt: skip
    note_model(request, model)
    pool = pool_of(request)
    options = CallOptions(allow_remote=allow_remote)
    job = TranscriptionRequest(language=language, prompt=prompt, temperature=temperature, word_timestamps=words,
                               task=task)  # fmt: skip
    transcription = await unless_disconnected(request, pool.transcribe(model, await file.read(), job, options))
    segments = transcription.segments
    if stream:
        events = transcript_events(segments, None if store is None else store.append)
        return EventStreamResponse(events, on_close=segments.aclose)
    async with segments:
        collected = await unless_disconnected(request, _collect(segments))
    if store is not None:
        await store.append(collected)
    if response_format == "json":
        return JSONResponse({"text": transcript_text(collected)})
    if response_format == "verbose_json":
        return JSONResponse(verbose_json(collected, task, transcription.audio_seconds, words))
    if response_format == "text":
        return PlainTextResponse(transcript_text(collected) + "\n")
    return PlainTextResponse(
        subtitles(collected, response_format),
        media_type="text/vtt" if response_format == "vtt" else "application/x-subrip",
    )


async def _collect(segments: ResultStream[Segment]) -> list[Segment]:
    return [segment async for segment in segments]


@router.post("/v1/audio/speech", response_model=None, response_class=Response,
             responses=declared(POOL_ERRORS, media={**_SPEECH_MEDIA, SSE: sse_events()}, rules=(
                 MODEL_LIMITS, "a voice the model has", "a response_format this server can encode")))  # fmt: skip
async def speech(body: SpeechBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    require_encoder(body.response_format)
    audio = await unless_disconnected(request, pool.speak(body.model, body.to_request(), body.call_options()))
    encoder = AudioEncoder(body.response_format, audio.sample_rate)
    chunks = audio.chunks
    if body.stream_format == "sse":
        return EventStreamResponse(speech_events(chunks, encoder), on_close=chunks.aclose)
    return ClosingStreamingResponse(encoded_speech(chunks, encoder), MEDIA_TYPES[body.response_format], chunks.aclose)


@router.get("/v1/audio/voices", responses=declared(LISTING_ERRORS))
async def voices(
    request: Request, model: str | None = Query(default=None, min_length=1, max_length=256)
) -> JSONResponse:
    """Voices of every text-to-speech model, or with `?model=` of that one only (unknown: 404;
    not a text-to-speech model: 400), read from the models' files (loads nothing)."""
    listed = [
        {"model": item.model, "voice": item.voice.name, "language": item.voice.language,
         "sample_rate": item.voice.sample_rate, "speaker_id": item.voice.speaker_id}
        for item in await pool_of(request).voices(model)
    ]  # fmt: skip
    return JSONResponse({"object": "list", "data": listed})
