"""The grammars of tool calls and response formats, checked with llguidance against the
real SmolLM2 vocabulary: what they accept and what they refuse, per model family."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llguidance import LLMatcher, LLTokenizer

from modelpool.backends.constraint import GrammarCompiler
from modelpool.backends.llama_cpp.model import GgufModel, grammar_tokenizer
from modelpool.errors import InvalidRequest
from modelpool.inference import OutputFormat, Tool, ToolChoice
from modelpool.tools.grammar import chat_grammar, output_grammar
from tests.e2e.conftest import smollm2_gguf

WEATHER = Tool("get_weather", "Weather.", {"type": "object", "properties": {"city": {"type": "string"}},
                                           "required": ["city"]})  # fmt: skip
ADD = Tool("add", None, {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]})
AGE = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[LLTokenizer]:
    model = GgufModel(str(smollm2_gguf()), model_id="smollm2", vocab_only=True)
    yield grammar_tokenizer(model)  # it tokenizes through the model's vocabulary: the model must outlive it
    model.close()


def accepts(tokenizer: LLTokenizer, grammar: str, text: str) -> bool:
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens = tokenizer.tokenize_str(text)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and matcher.is_accepting()


def calls(family: str, mode: str = "required", name: str | None = None, parallel: bool = True) -> str:
    grammar = chat_grammar([WEATHER, ADD], ToolChoice(mode, name), family, parallel=parallel, output=None,  # type: ignore[arg-type]
                           constrain_auto=True)  # fmt: skip
    assert grammar is not None
    return grammar


GOOD_CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "generic": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
}


@pytest.mark.parametrize("family", sorted(GOOD_CALLS))
def test_each_family_accepts_its_own_call_layout(tokenizer: LLTokenizer, family: str) -> None:
    assert accepts(tokenizer, calls(family), GOOD_CALLS[family])
    for other, text in GOOD_CALLS.items():
        if other != family and (family, other) != ("llama3_json", "generic"):
            assert not accepts(tokenizer, calls(family), text), other


@pytest.mark.parametrize("family", sorted(GOOD_CALLS))
def test_arguments_must_match_the_parameters(tokenizer: LLTokenizer, family: str) -> None:
    bad = GOOD_CALLS[family].replace('"city": "Paris"', '"city": 5')
    unknown = GOOD_CALLS[family].replace("get_weather", "get_time")
    assert not accepts(tokenizer, calls(family), bad)
    assert not accepts(tokenizer, calls(family), unknown)


def test_a_named_choice_allows_only_that_function(tokenizer: LLTokenizer) -> None:
    grammar = calls("generic", "function", "add")
    assert accepts(tokenizer, grammar, '{"tool_calls": [{"name": "add", "arguments": {"a": 3}}]}')
    assert not accepts(tokenizer, grammar, GOOD_CALLS["generic"])
    assert not accepts(tokenizer, grammar, '{"tool_calls": [{"name": "add", "arguments": {"a": -3}}]}')  # minimum


def test_parallel_calls_only_when_allowed(tokenizer: LLTokenizer) -> None:
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n' + GOOD_CALLS["hermes"]
    assert accepts(tokenizer, calls("hermes", parallel=True), two)
    assert not accepts(tokenizer, calls("hermes", parallel=False), two)


@pytest.mark.parametrize("family", sorted(GOOD_CALLS))
def test_auto_allows_plain_text_or_a_call_but_not_a_botched_call(tokenizer: LLTokenizer, family: str) -> None:
    grammar = calls(family, "auto")
    assert accepts(tokenizer, grammar, "Hello! It is sunny today.")
    assert accepts(tokenizer, grammar, GOOD_CALLS[family])
    assert not accepts(tokenizer, grammar, GOOD_CALLS[family][:-3] + "oops")


def test_none_or_no_tools_leaves_decoding_free_unless_a_format_is_asked() -> None:
    none = chat_grammar([WEATHER], ToolChoice("none"), "hermes", parallel=True, output=None, constrain_auto=True)
    assert none is None
    assert chat_grammar([], ToolChoice("auto"), "hermes", parallel=True, output=None, constrain_auto=True) is None
    free_auto = chat_grammar([WEATHER], ToolChoice("auto"), "hermes", parallel=True, output=None, constrain_auto=False)
    assert free_auto is None
    as_json = chat_grammar([], ToolChoice("auto"), "hermes", parallel=True, output=OutputFormat("json_object"),
                           constrain_auto=True)  # fmt: skip
    assert as_json == output_grammar(OutputFormat("json_object"))


@pytest.mark.parametrize(
    ("text", "ok"),
    [('{"age": 30}', True), ('{"age": -1}', False), ('{"age": 121}', False), ('{"age": "30"}', False),
     ("{}", False), ('{"age": 30', False)],
)  # fmt: skip
def test_a_schema_is_enforced_with_its_bounds(tokenizer: LLTokenizer, text: str, ok: bool) -> None:
    assert accepts(tokenizer, output_grammar(OutputFormat("json_schema", AGE)), text) is ok


def test_json_object_allows_any_object_only(tokenizer: LLTokenizer) -> None:
    grammar = output_grammar(OutputFormat("json_object"))
    assert accepts(tokenizer, grammar, '{"a": [1, {"b": null}], "c": "d"}')
    assert not accepts(tokenizer, grammar, "[1, 2]")
    assert not accepts(tokenizer, grammar, "Sure! Here is JSON")


def test_whitespace_runs_are_bounded(tokenizer: LLTokenizer) -> None:
    grammar = output_grammar(OutputFormat("json_schema", AGE))
    assert accepts(tokenizer, grammar, '{\n  "age": 30\n}')
    assert not accepts(tokenizer, grammar, "{" + "\n" * 40 + '"age": 30}')


def test_a_schema_llguidance_cannot_enforce_is_a_400_naming_the_field(tokenizer: LLTokenizer) -> None:
    unenforceable: dict[str, Any] = {"type": "object", "not": {"required": ["a"]}}
    grammar = output_grammar(OutputFormat("json_schema", unenforceable))
    compiler = GrammarCompiler(tokenizer, 49152, [2], 2)
    with pytest.raises(InvalidRequest) as raised:
        compiler.start(grammar, "response_format")
    assert raised.value.param == "response_format" and "not" in raised.value.message


def test_compiled_grammars_are_cached_and_each_sequence_gets_its_own_state(tokenizer: LLTokenizer) -> None:
    compiler = GrammarCompiler(tokenizer, 49152, [2], 2)
    grammar = output_grammar(OutputFormat("json_schema", AGE))
    first, second = compiler.start(grammar, "p"), compiler.start(grammar, "p")
    assert compiler._compiled(grammar, "p") is compiler._compiled(grammar, "p")
    for token in tokenizer.tokenize_str('{"age": 3'):
        first.advance(token)
    assert not first.allowed()[2]  # the object is open: no end of text yet
    open_brace = tokenizer.tokenize_str("{")[0]
    assert second.allowed()[open_brace] and not first.allowed()[open_brace]
    for token in tokenizer.tokenize_str("}"):
        first.advance(token)
    assert first.allowed()[2] and first.complete
    assert json.loads('{"age": 3}') == {"age": 3}
