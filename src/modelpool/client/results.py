"""Typed results, and the parsing of wire JSON into them.

Reasoning text is read from whichever field the endpoint's preset names (first non-empty
wins), so `.reasoning` means the same on vLLM (`reasoning_content`), Ollama (`reasoning`)
and modelpool. `raw` keeps the server's JSON for anything the SDK does not model.

Tool calls arrive whole in a `ChatResult` (`tool_calls`) and in pieces in a stream
(`ChatDelta.tool_calls`, joined by `ToolCallAccumulator`). A `response_format=Model`
answer is validated into the model (`ParsedChat.parsed`, or `parse_structured` for text
read from a stream).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from modelpool.client.errors import ClientError, StructuredOutputError, ToolArgumentsError

M = TypeVar("M", bound=BaseModel)
SHOWN_CHARS = 2000
"""How much of a model's unusable text an error message quotes (the error keeps all of it)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def parse(cls, raw: object) -> Usage | None:
        if not isinstance(raw, Mapping):
            return None
        prompt = int(raw.get("prompt_tokens") or 0)
        completion = int(raw.get("completion_tokens") or 0)
        return cls(prompt, completion, int(raw.get("total_tokens") or prompt + completion))


@dataclass(frozen=True)
class ToolCall:
    """A function call the model asks for (finish_reason "tool_calls"). Run it, then send
    `ChatMessage.from_result(reply)` and one `ChatMessage.tool(call.id, output)` per call."""

    id: str
    """The server's id for the call ("" if it sent none); the tool message answers to it."""
    name: str
    arguments: str
    """The arguments as the model wrote them: JSON text, kept verbatim for the history."""

    @property
    def args(self) -> dict[str, Any]:
        """The arguments parsed into a dict; blank text reads as `{}` (some servers send ""
        for a function without parameters). Raises ToolArgumentsError if they are not a
        JSON object: the model's mistake, which an agent may want to show it."""
        if not self.arguments.strip():
            return {}
        try:
            value = json.loads(self.arguments)
        except ValueError as exc:
            raise self._error(f"are not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise self._error(f"are JSON but not an object ({type(value).__name__})")
        return value

    def parse(self, model: type[M]) -> M:
        """The arguments validated into `model` (for tools given as a pydantic class);
        raises ToolArgumentsError with pydantic's complaints."""
        try:
            return model.model_validate_json(self.arguments if self.arguments.strip() else "{}")
        except ValidationError as exc:
            raise self._error(f"do not fit {model.__name__} ({validation_summary(exc)})") from exc

    def to_wire(self) -> dict[str, Any]:
        """The call as an assistant message in the history carries it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def _error(self, problem: str) -> ToolArgumentsError:
        message = f"the arguments of tool call {self.name!r} (id {self.id!r}) {problem}: {shown(self.arguments)}"
        return ToolArgumentsError(message, tool_name=self.name, arguments=self.arguments)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call. The first piece of an `index` carries `id` and
    `name`, later ones only more `arguments` text; `ToolCallAccumulator` joins them."""

    index: int
    """Which call of the answer this piece belongs to (calls may interleave)."""
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    """The next piece of the arguments' JSON text (not JSON by itself)."""


@dataclass(frozen=True)
class ChatResult:
    content: str
    """The answer text ("" when the model only called tools)."""
    reasoning: str
    """The model's thinking ("" when it did not think or the server does not separate it)."""
    usage: Usage | None
    finish_reason: str | None
    model: str | None
    raw: Mapping[str, Any] = field(repr=False)
    tool_calls: tuple[ToolCall, ...] = ()
    """The functions the model asks to call, in order (empty when it answered in text)."""


@dataclass(frozen=True, kw_only=True)
class ParsedChat(ChatResult, Generic[M]):
    """The result of `chat(..., response_format=Model)`: the answer validated into `Model`
    when the reply came (an answer that does not validate raised StructuredOutputError)."""

    _parsed: M | None = field(repr=False)
    """None only when the model called tools instead of answering."""

    @property
    def parsed(self) -> M:
        """The answer as a `Model` instance. Raises StructuredOutputError if the model called
        tools instead of answering: with tools in the request, look at `tool_calls` first."""
        if self._parsed is None:
            raise StructuredOutputError(
                "the model called tools instead of answering: there is no answer to parse (see .tool_calls)",
                text=self.content,
            )
        return self._parsed


@dataclass(frozen=True)
class ChatDelta:
    """One piece of a streamed answer; the last chunk may carry only `usage`."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    """Pieces of tool calls; feed the deltas to a `ToolCallAccumulator` for whole calls."""


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, piece: ToolCallDelta) -> None:
        self.id = self.id or piece.id or ""
        self.name = self.name or piece.name or ""
        self.arguments.append(piece.arguments)

    def whole(self, index: int) -> ToolCall:
        if not self.name:
            raise ClientError(f"the stream's tool call #{index} never named its function (id {self.id!r})")
        return ToolCall(self.id, self.name, "".join(self.arguments))


class ToolCallAccumulator:
    """Joins a stream's tool-call pieces back into whole calls:

        calls = ToolCallAccumulator()
        async for delta in llm.stream_chat(history, tools=[get_weather]):
            print(delta.content, end="")
            calls.add(delta)
        for call in calls.calls():
            output = get_weather(**call.args)

    Pieces are grouped by their `index`, so interleaved calls come apart correctly; the
    first id and name seen for an index stick, every piece appends argument text."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, delta: ChatDelta | ToolCallDelta) -> None:
        """Take a delta's tool-call pieces (a delta without any is fine: nothing happens)."""
        for piece in delta.tool_calls if isinstance(delta, ChatDelta) else (delta,):
            self._calls.setdefault(piece.index, _PartialCall()).add(piece)

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls seen so far, by index. Raises ClientError for a call whose function
        name never came (a server fault: the call could not be answered)."""
        return tuple(self._calls[index].whole(index) for index in sorted(self._calls))


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage | None
    finish_reason: str | None
    model: str | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    """One vector per input, in input order."""
    model: str | None
    usage: Usage | None


@dataclass(frozen=True)
class Ranked:
    index: int
    """The document's position in the request."""
    score: float
    document: Mapping[str, Any] | None = None
    """`{"text": ...}` (or the object sent) when asked for with return_documents."""


@dataclass(frozen=True)
class Reranking:
    results: list[Ranked]
    """Best first."""
    model: str | None
    usage: Usage | None

    @property
    def order(self) -> list[int]:
        """The documents' indexes, best first."""
        return [r.index for r in self.results]


@dataclass(frozen=True)
class TranscriptSegment:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None
    """None when the server answered plain `json` (no verbose_json)."""
    duration: float | None
    segments: list[TranscriptSegment]


@dataclass(frozen=True)
class Speech:
    audio: bytes
    format: str


@dataclass(frozen=True)
class Voice:
    voice: str
    model: str | None
    language: str | None
    sample_rate: int | None


def chat_result(raw: Mapping[str, Any], reasoning_fields: Sequence[str]) -> ChatResult:
    choice = _first_choice(raw)
    message = choice.get("message") or {}
    return ChatResult(
        content=message.get("content") or "",
        reasoning=pick_reasoning(message, reasoning_fields),
        usage=Usage.parse(raw.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=raw.get("model"),
        raw=raw,
        tool_calls=tuple(_tool_call(call) for call in message.get("tool_calls") or ()),
    )


def chat_delta(chunk: Mapping[str, Any], reasoning_fields: Sequence[str]) -> ChatDelta:
    choice = _first_choice(chunk)
    delta = choice.get("delta") or {}
    return ChatDelta(
        content=delta.get("content") or "",
        reasoning=pick_reasoning(delta, reasoning_fields),
        finish_reason=choice.get("finish_reason"),
        usage=Usage.parse(chunk.get("usage")),
        tool_calls=tuple(_tool_call_delta(piece, n) for n, piece in enumerate(delta.get("tool_calls") or ())),
    )


def whole_call_deltas(calls: Sequence[ToolCall]) -> tuple[ToolCallDelta, ...]:
    """Whole calls as stream pieces (one per call), for a stream that is one whole answer."""
    return tuple(ToolCallDelta(index, call.id, call.name, call.arguments) for index, call in enumerate(calls))


def parse_structured(model: type[M], text: str) -> M:
    """`text` validated into `model`, as `chat(..., response_format=model)` does with its
    answer; use it on the joined text of a stream. Raises StructuredOutputError with the text."""
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        message = f"the answer is not a valid {model.__name__} ({validation_summary(exc)}); the answer: {shown(text)}"
        raise StructuredOutputError(message, text=text) from exc


def parsed_chat(result: ChatResult, model: type[M]) -> ParsedChat[M]:
    """The result with its answer validated into `model`. An answer that called tools is
    not validated: the model has not answered yet, and its text (if any) is no JSON."""
    parsed = None if result.tool_calls else parse_structured(model, result.content)
    return ParsedChat(**{f.name: getattr(result, f.name) for f in fields(result)}, _parsed=parsed)


def validation_summary(error: ValidationError, most: int = 5) -> str:
    """pydantic's complaints on one line: `where: what`, the first `most` of them."""
    problems = [f"{'.'.join(map(str, e['loc'])) or 'the value'}: {e['msg']}" for e in error.errors()]
    more = f"; and {len(problems) - most} more" if len(problems) > most else ""
    return "; ".join(problems[:most]) + more


def shown(text: str) -> str:
    """The model's text quoted for an error message, cut at SHOWN_CHARS."""
    return repr(text) if len(text) <= SHOWN_CHARS else repr(text[:SHOWN_CHARS]) + f"… ({len(text)} characters)"


def completion(raw: Mapping[str, Any]) -> Completion:
    choice = _first_choice(raw)
    return Completion(
        text=choice.get("text") or "",
        usage=Usage.parse(raw.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=raw.get("model"),
        raw=raw,
    )


def embeddings(raw: Mapping[str, Any]) -> Embeddings:
    rows = sorted(raw.get("data") or [], key=lambda row: row.get("index", 0))
    vectors = [list(map(float, row["embedding"])) for row in rows]
    return Embeddings(vectors, raw.get("model"), Usage.parse(raw.get("usage")))


def reranking(raw: Mapping[str, Any]) -> Reranking:
    rows = raw.get("results") or []
    results = [Ranked(int(r["index"]), float(r["relevance_score"]), r.get("document")) for r in rows]
    return Reranking(sorted(results, key=lambda r: -r.score), raw.get("model"), Usage.parse(raw.get("usage")))


def scores(raw: Mapping[str, Any]) -> list[float]:
    return [float(row["score"]) for row in sorted(raw.get("data") or [], key=lambda row: row.get("index", 0))]


def transcript(raw: Mapping[str, Any]) -> Transcript:
    segments = [TranscriptSegment(float(s["start"]), float(s["end"]), s["text"]) for s in raw.get("segments") or []]
    duration = raw.get("duration")
    return Transcript(raw.get("text", "").strip(), raw.get("language"), None if duration is None else float(duration),
                      segments)  # fmt: skip


def voices(raw: Mapping[str, Any]) -> list[Voice]:
    return [
        Voice(str(v.get("voice") or v.get("name") or v.get("id")), v.get("model"), v.get("language"),
              v.get("sample_rate"))
        for v in raw.get("data") or raw.get("voices") or []
    ]  # fmt: skip


def pick_reasoning(message: Mapping[str, Any], fields: Sequence[str]) -> str:
    """The first non-empty reasoning field the preset names (servers disagree on the name)."""
    for name in fields:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _tool_call(raw: Mapping[str, Any]) -> ToolCall:
    function = raw.get("function") or {}
    return ToolCall(str(raw.get("id") or ""), str(function.get("name") or ""), _arguments(function.get("arguments")))


def _tool_call_delta(raw: Mapping[str, Any], position: int) -> ToolCallDelta:
    """A streamed piece; without an `index` (some servers send whole calls so), its place in the list."""
    function = raw.get("function") or {}
    index = raw.get("index")
    return ToolCallDelta(
        index=index if isinstance(index, int) else position,
        id=raw.get("id") or None,
        name=function.get("name") or None,
        arguments=_arguments(function.get("arguments")),
    )


def _arguments(value: object) -> str:
    """Arguments as JSON text; Ollama-style servers send them as an object, re-encoded here."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _first_choice(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = raw.get("choices") or [{}]
    first: Mapping[str, Any] = choices[0]
    return first
