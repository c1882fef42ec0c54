"""The tool-call parsers on outputs written the way each family's models write them, fed
whole, one character at a time and in random pieces: the result never depends on how the
output was split."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from modelpool.inference import ToolCall, ToolCallDelta
from modelpool.tools.calls import assemble_calls, merge_deltas
from modelpool.tools.parsers import TOOL_PARSERS, Parsed, make_parser, new_call_id
from modelpool.tools.partial_json import ValueScanner


def counting_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


@dataclass
class Output:
    content: str
    calls: tuple[ToolCall, ...]
    deltas: list[tuple[int, ToolCallDelta]]
    """Each delta with how many characters had been fed when it came out."""


def parse(family: str, pieces: list[str], *, live: bool) -> Output:
    parser = make_parser(family, live=live, new_id=counting_ids())
    content: list[str] = []
    deltas: list[tuple[int, ToolCallDelta]] = []
    fed = 0
    for piece in pieces:
        fed += len(piece)
        parsed = parser.feed(piece)
        content.append(parsed.content)
        deltas += [(fed, delta) for delta in parsed.calls]
    parsed = parser.finish()
    content.append(parsed.content)
    deltas += [(fed, delta) for delta in parsed.calls]
    return Output("".join(content), assemble_calls(d for _, d in deltas), deltas)


def splittings(text: str) -> dict[str, list[str]]:
    """Whole, character by character, and five seeded random splits."""
    splits = {"whole": [text], "chars": list(text)}
    for seed in range(5):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        splits[f"random{seed}"] = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    return splits


Calls = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    text: str
    content: str
    calls: Calls = ()
    live_content: str | None = None
    """When live mode reads it differently (malformed calls: live trusts the grammar)."""
    live_calls: Calls | None = None

    def expected(self, live: bool) -> tuple[str, tuple[ToolCall, ...]]:
        content = self.live_content if live and self.live_content is not None else self.content
        calls = self.live_calls if live and self.live_calls is not None else self.calls
        return content, tuple(ToolCall(f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(calls))


PARIS = '{"city": "Paris"}'
QWEN_ARGS_1 = '{"location": "San Francisco, CA, USA", "unit": "celsius"}'
QWEN_ARGS_2 = '{"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}'
TRICKY_ARGS = (
    '{"query": "SELECT * FROM t WHERE a = \\"}\\" AND b = \'{\'", '
    '"filters": {"tags": ["x", "y]"], "range": [1, 2.5e3, -0.5]}, "dry_run": false, "limit": null}'
)
UNICODE_ARGS = '{"city": "São Paulo", "note": "naïve \\u00e9 — 東京"}'

CASES = [
    # hermes: Hermes 2 Pro, Qwen 2/2.5/3, SmolLM3.
    Case(
        "hermes-qwen25-two-parallel",
        "hermes",
        f'<tool_call>\n{{"name": "get_current_temperature", "arguments": {QWEN_ARGS_1}}}\n</tool_call>\n'
        f'<tool_call>\n{{"name": "get_temperature_date", "arguments": {QWEN_ARGS_2}}}\n</tool_call>',
        "",
        (("get_current_temperature", QWEN_ARGS_1), ("get_temperature_date", QWEN_ARGS_2)),
    ),
    Case(
        "hermes2pro-text-before-arguments-first",
        "hermes",
        "I'll fetch the fundamentals for Tesla.\n<tool_call>\n"
        '{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>',
        "I'll fetch the fundamentals for Tesla.\n",
        (("get_stock_fundamentals", '{"symbol": "TSLA"}'),),
    ),
    Case(
        "hermes-text-after",
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\nI asked for the weather.',
        "\nI asked for the weather.",
        (("get_weather", PARIS),),
    ),
    Case(
        "hermes-tricky-strings",
        "hermes",
        f'<tool_call>\n{{"name": "run_query", "arguments": {TRICKY_ARGS}}}\n</tool_call>',
        "",
        (("run_query", TRICKY_ARGS),),
    ),
    Case(
        "hermes-unicode",
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {UNICODE_ARGS}}}\n</tool_call>',
        "",
        (("get_weather", UNICODE_ARGS),),
    ),
    Case(
        "hermes-compact-no-newlines",
        "hermes",
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
        "",
        (("get_weather", '{"city":"Paris"}'),),
    ),
    Case(
        "hermes-missing-closing-tag",
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "hermes-arguments-as-json-string",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
        "",
        (("get_weather", PARIS),),
        live_calls=(("get_weather", '"{\\"city\\": \\"Paris\\"}"'),),
    ),
    Case("hermes-plain", "hermes", "The capital of France is Paris.", "The capital of France is Paris."),
    Case(
        "hermes-prose-mentions-tags",
        "hermes",
        "Wrap a call in <tool_call> tags; <tool> or x<y or <tool_c are just text.",
        "Wrap a call in <tool_call> tags; <tool> or x<y or <tool_c are just text.",
    ),
    Case("hermes-ends-in-partial-marker", "hermes", "Nearly a marker: <tool_ca", "Nearly a marker: <tool_ca"),
    Case(
        "hermes-missing-brace",
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}\n</tool_call>',
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}\n</tool_call>',
        live_content="</tool_call>",
        live_calls=(("get_weather", PARIS),),
    ),
    Case(
        "hermes-not-json",
        "hermes",
        '<tool_call>\nget_weather(city="Paris")\n</tool_call>',
        '<tool_call>\nget_weather(city="Paris")\n</tool_call>',
    ),
    Case(
        "hermes-no-name",
        "hermes",
        f'<tool_call>\n{{"arguments": {PARIS}}}\n</tool_call>',
        f'<tool_call>\n{{"arguments": {PARIS}}}\n</tool_call>',
    ),
    Case(
        "hermes-name-not-a-string",
        "hermes",
        '<tool_call>\n{"name": 42, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": 42, "arguments": {}}\n</tool_call>',
    ),
    Case(
        "hermes-arguments-not-an-object",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
        live_content="",
        live_calls=(("get_weather", '["Paris"]'),),
    ),
    Case(
        "hermes-cut-short",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        live_content="",
        live_calls=(("get_weather", '{"city": "Par'),),
    ),
    Case(
        "hermes-second-block-broken",
        "hermes",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": }}\n</tool_call>',
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": }}\n</tool_call>',
        (("get_weather", PARIS),),
        live_content="",
        live_calls=(("get_weather", PARIS), ("get_time", '{"tz": }')),
    ),
    # llama3_json: Llama 3.1, 3.2, 3.3 JSON tool calling.
    Case(
        "llama31-python-tag",
        "llama3_json",
        '<|python_tag|>{"name": "get_current_conditions", "parameters": '
        '{"location": "San Francisco, CA", "unit": "Fahrenheit"}}',
        "",
        (("get_current_conditions", '{"location": "San Francisco, CA", "unit": "Fahrenheit"}'),),
    ),
    Case(
        "llama32-plain-json",
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {PARIS}}}',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "llama3-two-calls-semicolon",
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {PARIS}}}; '
        '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        "",
        (("get_weather", PARIS), ("get_time", '{"timezone": "Europe/Paris"}')),
    ),
    Case(
        "llama33-type-key-leading-whitespace",
        "llama3_json",
        f'\n\n{{"type": "function", "name": "get_weather", "parameters": {PARIS}}}',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "llama3-arguments-key",
        "llama3_json",
        f'{{"name": "get_weather", "arguments": {PARIS}}}',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "llama3-text-after",
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {PARIS}}}\nLet me know.',
        "\nLet me know.",
        (("get_weather", PARIS),),
    ),
    Case(
        "llama3-second-call-without-name",
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {PARIS}}}; {{"parameters": {{}}}}',
        f'{{"name": "get_weather", "parameters": {PARIS}}}; {{"parameters": {{}}}}',
        live_content='; {"parameters": {}}',
        live_calls=(("get_weather", PARIS),),
    ),
    Case("llama3-plain", "llama3_json", "It is 18°C and sunny in Paris.", "It is 18°C and sunny in Paris."),
    Case("llama3-leading-whitespace-plain", "llama3_json", "\n\nHello!", "\n\nHello!"),
    Case(
        "llama3-prose-with-braces",
        "llama3_json",
        'Use {city} as a placeholder; {"name": "x", "parameters": {}} is a call only at the start.',
        'Use {city} as a placeholder; {"name": "x", "parameters": {}} is a call only at the start.',
    ),
    Case(
        "llama3-json-answer",
        "llama3_json",
        '{"city": "Paris", "temperature": 18}',
        '{"city": "Paris", "temperature": 18}',
    ),
    Case(
        "llama3-json-answer-with-name",
        "llama3_json",
        '{"name": "Marie Curie", "born": 1867}',
        '{"name": "Marie Curie", "born": 1867}',
    ),
    Case(
        "llama31-builtin-tool-code",
        "llama3_json",
        '<|python_tag|>brave_search.call(query="current weather in Menlo Park")',
        '<|python_tag|>brave_search.call(query="current weather in Menlo Park")',
    ),
    Case(
        "llama3-cut-short",
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Par',
        '{"name": "get_weather", "parameters": {"city": "Par',
        live_content="",
        live_calls=(("get_weather", '{"city": "Par'),),
    ),
    # mistral: v0.3 / v7 arrays, v11 name[ARGS]{...}.
    Case(
        "mistral-v03-two",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_current_weather", '
        '"arguments": {"location": "Paris, France", "format": "celsius"}}, '
        '{"name": "get_current_time", "arguments": {"timezone": "Europe/Paris"}}]',
        "",
        (
            ("get_current_weather", '{"location": "Paris, France", "format": "celsius"}'),
            ("get_current_time", '{"timezone": "Europe/Paris"}'),
        ),
    ),
    Case(
        "mistral-nemo-with-id",
        "mistral",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {PARIS}, "id": "Xv7bQ2kLp"}}]',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "mistral-text-before",
        "mistral",
        f'Sure, let me look that up. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}]',
        "Sure, let me look that up. ",
        (("get_weather", PARIS),),
    ),
    Case(
        "mistral-v11",
        "mistral",
        f"[TOOL_CALLS]get_weather[ARGS]{PARIS}",
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "mistral-v11-two-text-before",
        "mistral",
        f'Let me check both.\n\n[TOOL_CALLS]get_weather[ARGS]{PARIS}[TOOL_CALLS]get_time[ARGS]{{"timezone": "UTC"}}',
        "Let me check both.\n\n",
        (("get_weather", PARIS), ("get_time", '{"timezone": "UTC"}')),
    ),
    Case(
        "mistral-plain-prose-brackets",
        "mistral",
        "Brackets like [TOOLS], [1] or [TOOL_C are just text.",
        "Brackets like [TOOLS], [1] or [TOOL_C are just text.",
    ),
    Case(
        "mistral-marker-then-prose",
        "mistral",
        "[TOOL_CALLS] I cannot call a tool for that.",
        "[TOOL_CALLS] I cannot call a tool for that.",
    ),
    Case(
        "mistral-v03-cut-short",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Par',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Par',
        live_content="",
        live_calls=(("get_weather", '{"city": "Par'),),
    ),
    Case(
        "mistral-v11-cut-short",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        live_content="",
        live_calls=(("get_weather", '{"city": "Par'),),
    ),
    Case(
        "mistral-v03-missing-comma",
        "mistral",
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}} {{"name": "get_time", "arguments": {{}}}}]',
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}} {{"name": "get_time", "arguments": {{}}}}]',
        live_content=' {"name": "get_time", "arguments": {}}]',
        live_calls=(("get_weather", PARIS),),
    ),
    # generic: llama.cpp's server format for templates without tool support.
    Case(
        "generic-llamacpp-pretty-with-id",
        "generic",
        '{\n  "tool_calls": [\n    {\n      "name": "get_weather",\n      "arguments": {\n        "city": "Paris"\n'
        '      },\n      "id": "123456789"\n    }\n  ]\n}',
        "",
        (("get_weather", '{\n        "city": "Paris"\n      }'),),
    ),
    Case(
        "generic-two-compact",
        "generic",
        f'{{"tool_calls":[{{"name":"get_weather","arguments":{PARIS}}},'
        '{"name":"get_time","arguments":{"timezone":"UTC"}}]}',
        "",
        (("get_weather", PARIS), ("get_time", '{"timezone":"UTC"}')),
    ),
    Case(
        "generic-second-call-cut-before-its-name",
        "generic",
        f'{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}},\n{{"name": "get_we',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-second-call-cut-at-its-key",
        "generic",
        f'{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}},\n{{"name": "get_weather", "arguments',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-spaced",
        "generic",
        f'{{ "tool_calls" : [ {{ "name" : "get_weather" , "arguments" : {PARIS} }} ] }}',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-single-tool-call",
        "generic",
        f'{{"tool_call": {{"name": "get_weather", "arguments": {PARIS}}}}}',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-text-before",
        "generic",
        f'I will call the tool.\n{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}}]}}',
        "I will call the tool.\n",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-response",
        "generic",
        '{"response": "The capital of France is Paris."}',
        "The capital of France is Paris.",
    ),
    Case(
        "generic-response-escapes",
        "generic",
        '\n{ "response" : "Line one\\nLine \\"two\\" \\u00e9" }\n',
        'Line one\nLine "two" é',
    ),
    Case(
        "generic-response-then-text",
        "generic",
        '{"response": "Paris."} And more.',
        '{"response": "Paris."} And more.',
    ),
    Case("generic-plain", "generic", "Paris is the capital of France.", "Paris is the capital of France."),
    Case(
        "generic-prose-with-braces",
        "generic",
        'Sets are written {1, 2, 3}; JSON like {"a": 1} or { "tool_c is just text.',
        'Sets are written {1, 2, 3}; JSON like {"a": 1} or { "tool_c is just text.',
    ),
    Case("generic-json-answer", "generic", '{"answer": 42}', '{"answer": 42}'),
    Case(
        "generic-missing-wrapper-brace",
        "generic",
        f'{{"tool_calls": [{{"name": "get_weather", "arguments": {PARIS}}}]',
        "",
        (("get_weather", PARIS),),
    ),
    Case(
        "generic-call-without-arguments",
        "generic",
        '{"tool_calls": [{"name": "get_weather"}]}',
        '{"tool_calls": [{"name": "get_weather"}]}',
    ),
]


def test_every_family_has_cases() -> None:
    assert {case.family for case in CASES} == set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral", "generic"}


@pytest.mark.parametrize("live", [False, True], ids=["whole-calls", "live"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_the_output_reads_the_same_however_it_is_split(case: Case, live: bool) -> None:
    expected = case.expected(live)
    for split, pieces in splittings(case.text).items():
        out = parse(case.family, pieces, live=live)
        assert (out.content, out.calls) == expected, split


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_whole_call_mode_emits_only_valid_calls_in_one_piece(case: Case) -> None:
    out = parse(case.family, list(case.text), live=False)
    assert [delta.index for _, delta in out.deltas] == list(range(len(out.calls)))
    for _, delta in out.deltas:
        assert delta.id is not None and delta.name
        assert isinstance(json.loads(delta.arguments), dict)


STREAMED = [
    c
    for c in CASES
    if c.id
    in {
        "hermes-qwen25-two-parallel",
        "hermes-tricky-strings",
        "llama31-python-tag",
        "llama3-two-calls-semicolon",
        "mistral-v03-two",
        "mistral-v11-two-text-before",
        "generic-llamacpp-pretty-with-id",
        "generic-two-compact",
    }
]


@pytest.mark.parametrize("case", STREAMED, ids=lambda case: case.id)
def test_live_calls_are_announced_as_their_arguments_begin_and_stream(case: Case) -> None:
    out = parse(case.family, list(case.text), live=True)
    cursor = 0
    for index, call in enumerate(out.calls):
        pieces = [(fed, d) for fed, d in out.deltas if d.index == index]
        (fed, first), rest = pieces[0], pieces[1:]
        assert (first.id, first.name) == (f"call_{index}", call.name)
        assert all(d.id is None and d.name is None for _, d in rest)
        start = case.text.index(call.arguments, cursor)
        cursor = start + len(call.arguments)
        # Out when the arguments' first character is in, long before their closing brace.
        assert fed == start + 1
        assert first.arguments == call.arguments[0]
        assert len(rest) == len(call.arguments) - 1  # one piece per character fed


def test_live_arguments_written_first_wait_for_the_name() -> None:
    text = '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>'
    out = parse("hermes", list(text), live=True)
    [(fed, delta)] = out.deltas
    assert delta == ToolCallDelta(0, "call_0", "get_stock_fundamentals", '{"symbol": "TSLA"}')
    # Out when the name's closing quote came in, before the object's closing brace.
    assert fed == text.index('fundamentals"') + len('fundamentals"') < text.index("}\n</tool_call>") + 1


def test_live_json_answer_with_a_name_key_is_not_announced_as_a_call() -> None:
    parser = make_parser("llama3_json", live=True, new_id=counting_ids())
    assert parser.feed('{"name": "Marie Curie", ') == Parsed()
    assert parser.feed('"born": 1867}') == Parsed('{"name": "Marie Curie", "born": 1867}')
    assert parser.finish() == Parsed()


def test_live_finish_sends_the_rest_of_a_cut_call() -> None:
    parser = make_parser("hermes", live=True, new_id=counting_ids())
    parsed = parser.feed('<tool_call>\n{"name": "set_volume", "arguments": 12')
    assert parsed.calls == (ToolCallDelta(0, "call_0", "set_volume"),)  # a number may still grow
    assert parser.finish().calls == (ToolCallDelta(0, arguments="12"),)


@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize(
    ("family", "pieces", "released"),
    [
        ("hermes", ["Hello <tool_"], "Hello "),
        ("hermes", ["Hello <tool_", "box> world"], "Hello <tool_box> world"),
        ("hermes", ["a < b and <tool_call"], "a < b and "),
        ("mistral", ["See [TOOL_"], "See "),
        ("mistral", ["See [TOOL_", "S] below"], "See [TOOL_S] below"),
        ("generic", ['Sure {"tool_ca'], "Sure "),
        ("generic", ['Sure {  "tool_calls"  '], "Sure "),
        ("generic", ["Sure {", " braces}"], "Sure { braces}"),
        ("generic", ['{"respon'], ""),
        ("llama3_json", ["Hello"], "Hello"),
        ("llama3_json", ["  "], ""),
        ("llama3_json", ["  <|python"], ""),
        ("llama3_json", ["  <|python", "ista|> hi"], "  <|pythonista|> hi"),
    ],
)
def test_content_is_held_back_only_while_it_may_start_a_call(
    family: str, pieces: list[str], released: str, live: bool
) -> None:
    parser = make_parser(family, live=live)
    assert "".join(parser.feed(piece).content for piece in pieces) == released


def test_whitespace_between_blocks_is_not_content() -> None:
    block = f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>'
    parser = make_parser("hermes", live=False, new_id=counting_ids())
    assert parser.feed(block + "\n\n").content == ""
    assert parser.feed(block + "\n").content == ""
    assert parser.finish() == Parsed()
    parser = make_parser("hermes", live=False, new_id=counting_ids())
    assert parser.feed(block + "\n\n").content == ""
    assert parser.feed("Done.").content == "\n\nDone."


def test_calls_are_numbered_across_blocks_and_feeds() -> None:
    parser = make_parser("mistral", live=False, new_id=counting_ids())
    first = parser.feed(f"[TOOL_CALLS]a[ARGS]{PARIS}[TOOL_CALLS]")
    assert first.calls == (ToolCallDelta(0, "call_0", "a", PARIS),)
    assert parser.feed(f"b[ARGS]{PARIS}").calls == ()  # a call without a closer ends with what follows
    assert parser.finish().calls == (ToolCallDelta(1, "call_1", "b", PARIS),)


def test_make_parser() -> None:
    for family, parser_class in TOOL_PARSERS.items():
        assert isinstance(make_parser(family, live=False), parser_class)
    with pytest.raises(ValueError, match="hermes"):
        make_parser("pythonic", live=True)


def test_new_call_id() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


def test_assemble_calls_merges_by_index() -> None:
    deltas = [
        ToolCallDelta(1, "call_b", "b"),
        ToolCallDelta(0, "call_a", "a", '{"x"'),
        ToolCallDelta(1, arguments="{}"),
        ToolCallDelta(0, arguments=": 1}"),
    ]
    assert assemble_calls(deltas) == (ToolCall("call_a", "a", '{"x": 1}'), ToolCall("call_b", "b", "{}"))
    assert assemble_calls([]) == ()


def test_merge_deltas_joins_pieces_of_the_same_call() -> None:
    deltas = [
        ToolCallDelta(0, "call_a", "a"),
        ToolCallDelta(0, arguments="{"),
        ToolCallDelta(0, arguments="}"),
        ToolCallDelta(1, "call_b", "b", "{"),
        ToolCallDelta(1, arguments="}"),
    ]
    assert merge_deltas(deltas) == (ToolCallDelta(0, "call_a", "a", "{}"), ToolCallDelta(1, "call_b", "b", "{}"))


# The scanner under the parsers.


def scan_in_pieces(text: str, start: int = 0) -> ValueScanner:
    scanner = ValueScanner(start)
    for end in range(start, len(text) + 1):
        scanner.scan(text[:end])
    return scanner


def test_scanner_finds_members_and_the_end() -> None:
    text = 'x {"name": "a\\"}", "n": -1.5, "arguments": {"q": ["}", {"r": "]"}]}, "ok": true} tail'
    for scanner in (scan_in_pieces(text, 2), ValueScanner(2)):
        scanner.scan(text)
        spans = {m.key: text[m.value_start : m.value_end] for m in scanner.members}
        assert spans == {"name": '"a\\"}"', "n": "-1.5", "arguments": '{"q": ["}", {"r": "]"}]}', "ok": "true"}
        assert text[2 : scanner.end] == text[2:-5]


def test_scanner_reports_an_unfinished_value() -> None:
    scanner = ValueScanner(0)
    scanner.scan('{"name": "get_weather", "arguments": {"city": "Pa')
    assert scanner.end is None and scanner.failed_at is None
    name, arguments = scanner.members
    assert (name.value_end, arguments.value_end) == (22, None)
    assert arguments.value_start == 37


@pytest.mark.parametrize(
    ("text", "at"),
    [("{name: 1}", 1), ('{"a" 1}', 5), ('{"a": [1}', 8), ('{"a": 1]', 7), ("x", 0), ('{"a": 1 "b": 2}', 8)],
)
def test_scanner_gives_up_where_the_structure_breaks(text: str, at: int) -> None:
    for scanner in (scan_in_pieces(text), ValueScanner(0)):
        scanner.scan(text)
        assert scanner.failed_at == at
