"""Tool calls in a model's streamed output, read the way each model family writes them.

One streaming engine does the work; a family only describes its layout: the markers that
open its calls, what closes them, and which key holds the arguments.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...   (Hermes 2 Pro, Qwen 2/2.5/3, SmolLM3)
    llama3_json  [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}      (Llama 3.1-3.3, only at the start)
    mistral      [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]          (v0.3 / v7 tokenizers)
                 [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}         (v11+)
    generic      {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}       (llama.cpp's server,
                 {"tool_call": {...}}, or {"response": "..."} for an answer      for templates without tools)

Text around the calls is content, released as soon as it cannot be the start of a marker.
With `live` (decoding held to a grammar, so calls are well-formed) a call is announced as
soon as its name is known and its arguments stream as they are written; otherwise a call
is emitted only when its whole block is closed and valid, and anything that never becomes
a valid call is given back as content. Parsing never raises.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from modelpool.inference import ToolCallDelta
from modelpool.tools.calls import merge_deltas
from modelpool.tools.partial_json import SPACE, ValueScanner, skip_space


@dataclass(frozen=True)
class Parsed:
    """What a piece of output released."""

    content: str = ""
    """Plain text for the client."""
    calls: tuple[ToolCallDelta, ...] = ()


class ToolCallParser(Protocol):
    def feed(self, text: str) -> Parsed:
        """The next piece of output."""
        ...

    def finish(self) -> Parsed:
        """The output ended: whatever was held back."""
        ...


_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A call id as OpenAI writes them: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class Marker:
    """Where a block of calls starts, and what must follow its calls to close it."""

    pieces: tuple[str, ...]
    """Literal text that opens the block; whitespace may separate the pieces (so that
    `{ "tool_calls" :` matches like `{"tool_calls":`). Empty: the calls start right away."""
    closer: tuple[str, ...] = ()
    """What closes the block after its calls, whitespace allowed before each piece."""
    at_start: bool = False
    """Only at the very start of the output (after whitespace)."""


@dataclass(frozen=True)
class Family:
    markers: tuple[Marker, ...]
    argument_keys: tuple[str, ...] = ("arguments",)
    """The keys that may hold a call's arguments (the first one written counts)."""
    named_calls: bool = False
    """A call may be `name[ARGS]{...}` (Mistral's v11 tokenizer) instead of an object."""
    answer: Marker | None = None
    """An output that is one object under this marker may be a wrapped plain answer
    (llama.cpp's `{"response": "..."}`): held whole, and judged at the end."""


PARTIAL = -1
"""`_match`: the text ends inside the marker."""


def _match(text: str, pos: int, pieces: tuple[str, ...], final: bool) -> int | None:
    """The end of `pieces` written at `pos`, PARTIAL if the text ends before they could be
    told apart (and more is to come), None if they are not there."""
    for n, piece in enumerate(pieces):
        if n:
            pos = skip_space(text, pos)
        written = text[pos : pos + len(piece)]
        if written == piece:
            pos += len(piece)
        elif not final and len(written) < len(piece) and piece.startswith(written):
            return PARTIAL
        else:
            return None
    return pos


class _Broken(Exception):
    """The block being parsed is not calls from `at` on."""

    def __init__(self, at: int) -> None:
        self.at = at


@dataclass
class _Call:
    """The call being read: an object (`{"name": ..., "arguments": ...}`), or, when `name`
    is set at its start, the v11 `name[ARGS]` layout whose `scanner` is the arguments."""

    start: int
    scanner: ValueScanner | None = None
    name: str | None = None
    index: int | None = None
    """Live: set once its first delta is out."""
    sent: int = 0
    """Live: how much of its arguments' text is out."""


_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
"""The characters of a v11 call's name."""
_ARGS = "[ARGS]"


class StreamingToolParser:
    """Finds a family's calls in output fed piece by piece.

    States: `text` (looking for a marker), `open` (a marker was seen: an array, an object or
    a v11 name follows), `item` (in an array, before a call), `object`, `name` and `args`
    (reading a call), `after` (after a call: another, a separator, or the end of the
    block), `closer` (the family's closing text), `answer` (a possible wrapped answer).
    Positions index `_buf`, which starts at the block being read (or at undecided text).
    """

    family: ClassVar[Family]

    def __init__(self, *, live: bool, new_id: Callable[[], str] = new_call_id) -> None:
        self.live = live
        self._new_id = new_id
        self._start_markers = [m for m in self.family.markers if m.at_start]
        if self.family.answer is not None:
            self._start_markers.append(self.family.answer)
        self._markers = [m for m in self.family.markers if not m.at_start]
        self._first_chars = {m.pieces[0][0] for m in self._markers}
        self._handlers: dict[str, Callable[[bool], bool]] = {
            "text": self._text,
            "open": self._open,
            "item": self._item,
            "object": self._object,
            "name": self._name,
            "args": self._args,
            "after": self._after,
            "closer": self._closer,
            "answer": lambda final: False,
        }
        self._buf = ""
        self._state = "text"
        self._started = False
        """Past the start of the output, where `at_start` markers may be."""
        self._after_call = False
        """Whitespace after a block of calls is held: dropped if another block or the end
        follows, released if other text does."""
        self._next_index = 0
        self._content: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        # The block being read.
        self._marker = Marker(())
        self._pos = 0
        self._in_array = False
        self._call: _Call | None = None
        self._calls_in_block = 0
        self._pending: list[tuple[str, str]] = []
        """Not live: the block's calls, emitted when it closes."""
        self._keep_from = 0
        """Where text not yet accounted for by emitted calls starts: given back as content
        if the block breaks."""

    def feed(self, text: str) -> Parsed:
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> Parsed:
        self._run(final=True)
        if self._state == "answer":
            self._content.append(_unwrap_answer(self._buf))
            self._buf, self._state = "", "text"
        elif self._state != "text":
            self._cut_short()
            self._run(final=True)
        return self._take()

    def _run(self, final: bool) -> None:
        """Steps through the buffer while there is enough text to decide. `final`: no more
        text comes, so a partial marker is no marker."""
        while True:
            try:
                if not self._handlers[self._state](final):
                    return
            except _Broken as broken:
                self._fail(broken.at)

    def _take(self) -> Parsed:
        parsed = Parsed("".join(self._content), merge_deltas(self._deltas))
        self._content, self._deltas = [], []
        return parsed

    # Text outside calls.

    def _text(self, final: bool) -> bool:
        buf = self._buf
        if not self._started and self._start_markers:
            start = skip_space(buf, 0)
            if start == len(buf) and not final:
                return False
            for marker in self._start_markers:
                end = _match(buf, start, marker.pieces, final)
                if end == PARTIAL:
                    return False
                if end is not None:
                    # The whitespace before it goes with the block: dropped if it is calls,
                    # given back with it if it is not.
                    self._open_block(0, end, marker)
                    return True
            self._started = True
        hold = len(buf)
        for i, char in enumerate(buf):
            if char not in self._first_chars:
                continue
            ends = [(_match(buf, i, m.pieces, final), m) for m in self._markers]
            found = next(((end, m) for end, m in ends if end is not None and end != PARTIAL), None)
            if found is not None:
                if not (self._after_call and _is_space(buf[:i])):
                    self._content.append(buf[:i])
                self._open_block(i, found[0], found[1])
                return True
            if any(end == PARTIAL for end, _ in ends):
                hold = i
                break
        released = buf[:hold]
        if self._after_call and _is_space(released):
            if not final:
                return False
        else:
            self._content.append(released)
            self._after_call = False
        self._buf = buf[hold:]
        return False

    def _open_block(self, start: int, end: int, marker: Marker) -> None:
        self._buf = self._buf[start:]
        self._pos = end - start
        self._marker = marker
        self._state = "answer" if marker is self.family.answer else "open"
        self._started = True
        self._after_call = False
        self._in_array = False
        self._calls_in_block = 0
        self._keep_from = 0

    # A block of calls.

    def _open(self, final: bool) -> bool:
        at = skip_space(self._buf, self._pos)
        if at == len(self._buf):
            return False
        if self._buf[at] == "[":
            self._in_array = True
            self._pos = at + 1
            self._state = "item"
        elif self._buf[at] == "{":
            self._begin_object(at)
        elif self.family.named_calls:
            self._call = _Call(at)
            self._state = "name"
        else:
            raise _Broken(at)
        return True

    def _item(self, final: bool) -> bool:
        at = skip_space(self._buf, self._pos)
        if at == len(self._buf):
            return False
        if self._buf[at] == "{":
            self._begin_object(at)
        elif self._buf[at] == "]" and self._calls_in_block == 0:
            self._pos = at + 1  # an empty list of calls
            self._state = "closer"
        else:
            raise _Broken(at)
        return True

    def _begin_object(self, at: int) -> None:
        self._call = _Call(at, ValueScanner(at))
        self._state = "object"

    def _object(self, final: bool) -> bool:
        call = self._current()
        scanner = self._scan(call)
        if scanner.end is None:
            return False
        if self.live and call.index is None:
            raise _Broken(scanner.end)  # no name, or no arguments: nothing of it went out
        if not self.live:
            self._pending.append(self._validated(call, scanner.end))
        self._call_done(scanner.end)
        return True

    def _name(self, final: bool) -> bool:
        call = self._current()
        valid = _NAME.match(self._buf, call.start)
        end = valid.end() if valid else call.start
        after = self._buf[end : end + len(_ARGS)]
        if after == _ARGS and end > call.start:
            call.name = self._buf[call.start : end]
            self._pos = end + len(_ARGS)
            self._state = "args"
            return True
        if len(after) < len(_ARGS) and _ARGS.startswith(after):
            return False
        raise _Broken(end)  # prose after the marker, not a name

    def _args(self, final: bool) -> bool:
        call = self._current()
        if call.scanner is None:
            at = skip_space(self._buf, self._pos)
            if at == len(self._buf):
                return False
            if self._buf[at] not in "{[":
                raise _Broken(at)
            call.scanner = ValueScanner(at)
        scanner = self._scan(call)
        if scanner.end is None:
            return False
        if not self.live:
            arguments = self._buf[scanner.start : scanner.end]
            if not isinstance(_loads(arguments, scanner.end), dict):
                raise _Broken(scanner.end)
            self._pending.append((call.name or "", arguments))
        self._call_done(scanner.end)
        return True

    def _call_done(self, end: int) -> None:
        self._calls_in_block += 1
        if self.live:
            self._keep_from = end
        self._call = None
        self._pos = end
        self._state = "after"

    def _after(self, final: bool) -> bool:
        if self._in_array:
            at = skip_space(self._buf, self._pos)
            if at == len(self._buf):
                return False
            if self._buf[at] == ",":
                self._pos, self._state = at + 1, "item"
            elif self._buf[at] == "]":
                self._pos, self._state = at + 1, "closer"
            else:
                raise _Broken(at)
            return True
        # Bare calls may follow one another, separated by whitespace or `;` (Llama 3).
        at = skip_space(self._buf, self._pos, SPACE + ";")
        if at == len(self._buf):
            return False
        if self._buf[at] == "{":
            self._begin_object(at)
        else:
            self._state = "closer"
        return True

    def _closer(self, final: bool) -> bool:
        if not self._marker.closer:
            self._close_block(self._pos)
            return True
        at = skip_space(self._buf, self._pos)
        # Never final here: at the end, a missing closer is forgiven (`_cut_short`).
        end = _match(self._buf, at, self._marker.closer, final=False)
        if end is None:
            raise _Broken(at)
        if end == PARTIAL:
            return False
        self._close_block(end)
        return True

    def _close_block(self, end: int) -> None:
        for name, arguments in self._pending:
            self._deltas.append(ToolCallDelta(self._next_index, self._new_id(), name, arguments))
            self._next_index += 1
        self._pending.clear()
        self._after_call = self._calls_in_block > 0
        self._buf = self._buf[end:]
        self._state = "text"

    def _fail(self, at: int) -> None:
        """The block is not calls from `at` on: what of it no emitted call accounts for is
        content, and the text from `at` is read again as text."""
        call = self._call
        start = at if call is not None and call.index is not None else self._keep_from
        if start < at:
            self._content.append(self._buf[start:at])
        self._buf = self._buf[at:]
        self._call = None
        self._pending.clear()
        self._state = "text"

    def _cut_short(self) -> None:
        """The output ended inside a block (a length limit, or a missing closer)."""
        call = self._call
        if call is not None and call.index is not None:
            self._send(call, final=True)  # live: the rest of its arguments, as far as they go
            self._close_block(len(self._buf))
        elif self._calls_in_block:
            # Whole calls, then at most the start of one cut off before its name was out: the
            # whole calls stand and the fragment is dropped (`finish_reason: length` says the
            # reply was cut), never shown as text after the calls.
            self._close_block(len(self._buf))
        else:
            self._fail(len(self._buf))

    # The current call.

    def _current(self) -> _Call:
        assert self._call is not None
        return self._call

    def _scan(self, call: _Call) -> ValueScanner:
        """Reads on in the call's JSON; live, sends what of it is sure, even when the JSON
        breaks further on (so that how the output was split changes nothing)."""
        scanner = call.scanner
        assert scanner is not None
        scanner.scan(self._buf)
        if self.live:
            self._send(call)
        if scanner.failed_at is not None:
            raise _Broken(scanner.failed_at)
        return scanner

    def _arguments_span(self, call: _Call, final: bool) -> tuple[int, int] | None:
        """Where the call's arguments start, and how far their text can no longer change."""
        scanner = call.scanner
        if scanner is None:
            return None
        if call.name is not None:  # v11: the scanned value is the arguments
            return scanner.start, scanner.end if scanner.end is not None else scanner.pos
        member = next((m for m in scanner.members if m.key in self.family.argument_keys), None)
        if member is None:
            return None
        if member.value_end is not None:
            return member.value_start, member.value_end
        if final or self._buf[member.value_start] in '{["':
            return member.value_start, scanner.pos
        return member.value_start, member.value_start  # a number may still grow

    def _call_name(self, call: _Call) -> str | None:
        """The name of a call object, once it is whole."""
        scanner = call.scanner
        assert scanner is not None
        member = next((m for m in scanner.members if m.key == "name"), None)
        if member is None:
            return None
        if self._buf[member.value_start] != '"':
            raise _Broken(member.value_start)
        if member.value_end is None:
            return None
        name = _loads(self._buf[member.value_start : member.value_end], member.value_start)
        assert isinstance(name, str)
        return name

    def _send(self, call: _Call, final: bool = False) -> None:
        """Live: the call's first delta once its name is whole and its arguments have begun
        (a JSON answer with a `name` key is then not mistaken for a call), then the text
        of its arguments as it comes."""
        span = self._arguments_span(call, final)
        if span is None:
            return
        if call.index is None:
            name = call.name if call.name is not None else self._call_name(call)
            if name is None:
                return  # the arguments (Hermes 2 Pro writes them first) wait for the name
            call.index = self._next_index
            self._next_index += 1
            self._deltas.append(ToolCallDelta(call.index, self._new_id(), name))
        start, end = span
        if start + call.sent < end:
            self._deltas.append(ToolCallDelta(call.index, arguments=self._buf[start + call.sent : end]))
            call.sent = end - start

    def _validated(self, call: _Call, end: int) -> tuple[str, str]:
        """Not live: (name, arguments text) of a whole call object, or _Broken."""
        scanner = call.scanner
        assert scanner is not None
        value = _loads(self._buf[call.start : end], end)
        member = next((m for m in scanner.members if m.key in self.family.argument_keys), None)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or member is None:
            raise _Broken(end)
        arguments = self._buf[member.value_start : member.value_end]
        parsed = _loads(arguments, end)
        if isinstance(parsed, str):  # arguments written as a JSON string holding the object
            arguments, parsed = parsed, _loads(parsed, end)
        if not isinstance(parsed, dict):
            raise _Broken(end)
        return value["name"], arguments


def _loads(text: str, at: int) -> object:
    """`json.loads`, a failure being a broken block at `at`."""
    try:
        return json.loads(text)
    except ValueError:
        raise _Broken(at) from None


def _is_space(text: str) -> bool:
    return skip_space(text, 0) == len(text)


def _unwrap_answer(text: str) -> str:
    """llama.cpp's generic format answers `{"response": ...}`; anything else is kept as written."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, dict) or list(value) != ["response"]:
        return text
    response = value["response"]
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


class HermesParser(StreamingToolParser):
    family = Family(markers=(Marker(("<tool_call>",), closer=("</tool_call>",)),))


class Llama3JsonParser(StreamingToolParser):
    family = Family(
        markers=(Marker(("<|python_tag|>",), at_start=True), Marker((), at_start=True)),
        argument_keys=("parameters", "arguments"),
    )


class MistralParser(StreamingToolParser):
    family = Family(markers=(Marker(("[TOOL_CALLS]",)),), named_calls=True)


class GenericParser(StreamingToolParser):
    family = Family(
        markers=(
            Marker(("{", '"tool_calls"', ":"), closer=("}",)),
            Marker(("{", '"tool_call"', ":"), closer=("}",)),
        ),
        answer=Marker(("{", '"response"', ":"), at_start=True),
    )


TOOL_PARSERS: dict[str, type[StreamingToolParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "generic": GenericParser,
}


def make_parser(family: str, *, live: bool, new_id: Callable[[], str] = new_call_id) -> ToolCallParser:
    """The parser of a family's output. `live`: decoding is held to the family's call
    grammar, so calls can be streamed as they are written."""
    try:
        parser = TOOL_PARSERS[family]
    except KeyError:
        raise ValueError(f"unknown tool parser {family!r}; known: {', '.join(TOOL_PARSERS)}") from None
    return parser(live=live, new_id=new_id)
