from __future__ import annotations

import json

import pytest

from modelpool.api.errors import render_error
from modelpool.errors import ContextLengthExceeded, ModelLoadFailed, ModelNotFound, ModelNotReady
from modelpool.wire.openai.errors import param_from_loc, validation_message


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "messages", 0, "content"), "messages[0].content"),
        (("body", "input", "list[str]", 3), "input[3]"),
        (
            ("body", "messages", 1, "content", "list[tagged-union[TextPart,ImagePart]]", 0, "text"),
            "messages[1].content[0].text",
        ),
        (("body",), None),
        (("body", "stop", "str"), "stop"),
        (("body", "n", "function-after[_one_choice(), int]"), "n"),
    ],
)
def test_param_from_loc(loc: tuple[object, ...], param: str | None) -> None:
    assert param_from_loc(loc) == param


def test_envelope_shape_status_and_headers() -> None:
    response = render_error(ModelNotReady("model 'm' is still loading", retry_after_s=7))
    assert response.status_code == 503 and response.headers["retry-after"] == "7"
    assert json.loads(bytes(response.body)) == {  # Starlette types a body as bytes or a memoryview
        "error": {
            "message": "model 'm' is still loading",
            "type": "server_error",
            "param": "model",
            "code": "model_not_ready",
        }
    }
    missing = json.loads(bytes(render_error(ModelNotFound("x", ["a", "b"])).body))["error"]
    assert missing["code"] == "model_not_found" and "Known models: a, b" in missing["message"]
    assert render_error(ModelLoadFailed("boom")).status_code == 503
    too_long = render_error(ContextLengthExceeded("long", param="prompt"))
    assert too_long.status_code == 400 and json.loads(bytes(too_long.body))["error"]["param"] == "prompt"


def test_validation_messages_read_like_openais() -> None:
    assert validation_message([{"type": "extra_forbidden", "loc": ("body", "foo"), "msg": "x"}]) == (
        "Unrecognized request argument supplied: foo",
        "foo",
    )
    assert validation_message([{"type": "missing", "loc": ("body", "model"), "msg": "Field required"}]) == (
        "Missing required parameter: 'model'.",
        "model",
    )
    message, param = validation_message(
        [{"type": "json_invalid", "loc": ("body", 3), "msg": "x", "ctx": {"error": "Expecting value"}}]
    )
    assert param is None and "not valid JSON" in message
