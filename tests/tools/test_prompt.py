"""How tools reach a local model: the family a chat template teaches, the generic format for
templates without tools, and the history of calls and results rendered either way."""

from __future__ import annotations

import json

from modelpool.backends.llama_cpp.chat_template import ChatTemplate
from modelpool.inference import ChatMessage, ChatRequest, OutputFormat, Tool, ToolCall, ToolChoice
from modelpool.tools.prompt import detect_family, plan_chat, template_handles_tools

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""SmolLM2's template, in substance: no tools."""

HERMES = (
    "{% if tools %}<|im_start|>system\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The Qwen2.5 / Hermes layout, cut down."""

ADD = Tool("add", "Adds <two> numbers & more.", {"type": "object", "properties": {"a": {"type": "integer"}}})
CALL = ToolCall("call_1", "add", '{"a": 2}')
HISTORY = (
    ChatMessage("user", "add 2"),
    ChatMessage("assistant", "", tool_calls=(CALL,)),
    ChatMessage("tool", "4", tool_call_id="call_1"),
)


def test_the_family_comes_from_the_template_markers() -> None:
    assert template_handles_tools(HERMES) and not template_handles_tools(CHATML)
    assert detect_family(HERMES) == "hermes"
    assert detect_family(CHATML) == "generic" and detect_family(None) == "generic"
    assert detect_family("{{ tools }}[TOOL_CALLS]") == "mistral"
    assert detect_family("{% if tools %}<|python_tag|>{% endif %}") == "llama3_json"
    assert detect_family("{% if tools %}{{ tools }}{% endif %}") == "hermes"


def test_a_template_without_tools_gets_the_generic_format_in_its_system_message() -> None:
    request = ChatRequest((ChatMessage("system", "Be brief."), *HISTORY), tools=(ADD,))
    plan = plan_chat(request, template_source=CHATML, configured_parser="hermes", constrain_auto=True)
    assert plan.parser == "generic" and plan.tools is None and plan.live
    system, _user, assistant, tool = plan.messages
    assert system["content"].startswith("Be brief.\n\n") and '"name": "add"' in system["content"]
    assert json.loads(assistant["content"]) == {"tool_calls": [{"name": "add", "arguments": {"a": 2}}]}
    assert tool["role"] == "user"
    assert json.loads(tool["content"]) == {"tool_response": {"tool_call_id": "call_1", "name": "add", "content": "4"}}
    rendered = ChatTemplate(CHATML, bos_token="", eos_token="").render(plan.messages, plan.tools)
    assert rendered.count("<|im_start|>") == 5 and '{"tool_calls": [' in rendered


def test_a_template_with_tools_renders_them_itself_with_plain_json() -> None:
    plan = plan_chat(ChatRequest(HISTORY, tools=(ADD,)), template_source=HERMES, configured_parser=None,
                     constrain_auto=True)  # fmt: skip
    assert plan.parser == "hermes" and plan.tools == [{"type": "function", "function": {
        "name": "add", "description": ADD.description, "parameters": dict(ADD.parameters)}}]  # fmt: skip
    assert plan.messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 2}  # an object for the template
    assert plan.messages[2] == {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "add"}
    rendered = ChatTemplate(HERMES, bos_token="", eos_token="").render(plan.messages, plan.tools)
    assert "Adds <two> numbers & more." in rendered  # tojson as Hugging Face's: no HTML escapes
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>' in rendered


def test_no_calls_without_tools_or_with_choice_none() -> None:
    none = plan_chat(ChatRequest(HISTORY[:1], tools=(ADD,), tool_choice=ToolChoice("none")), template_source=HERMES,
                     configured_parser=None, constrain_auto=True)  # fmt: skip
    assert none.parser is None and none.grammar is None and none.tools is None
    formatted = plan_chat(ChatRequest(HISTORY[:1], output=OutputFormat("json_object")), template_source=CHATML,
                          configured_parser=None, constrain_auto=True)  # fmt: skip
    assert formatted.parser is None and formatted.grammar is not None and "%json" in formatted.grammar


def test_unconstrained_auto_parses_calls_only_once_whole() -> None:
    free = plan_chat(ChatRequest(HISTORY[:1], tools=(ADD,)), template_source=HERMES, configured_parser=None,
                     constrain_auto=False)  # fmt: skip
    assert free.grammar is None and free.parser == "hermes" and not free.live
    required = plan_chat(ChatRequest(HISTORY[:1], tools=(ADD,), tool_choice=ToolChoice("required")),
                         template_source=HERMES, configured_parser=None, constrain_auto=False)  # fmt: skip
    assert required.grammar is not None and required.live


def test_history_of_calls_is_shown_as_text_to_a_template_without_tools_even_with_choice_none() -> None:
    plan = plan_chat(ChatRequest(HISTORY, tools=(ADD,), tool_choice=ToolChoice("none")), template_source=CHATML,
                     configured_parser=None, constrain_auto=True)  # fmt: skip
    assert plan.tools is None and plan.parser is None
    assert json.loads(plan.messages[1]["content"]) == {"tool_calls": [{"name": "add", "arguments": {"a": 2}}]}
    assert plan.messages[2]["role"] == "user" and "tool_response" in plan.messages[2]["content"]
