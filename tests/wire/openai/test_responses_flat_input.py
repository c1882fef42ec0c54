"""A flat `input` part whose `type` is not a string (schemathesis sent `"type": [null, null]`)
is a 400 naming the field, not a 500: the type is looked up in a set only when it is a string."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from modelpool.wire.openai.responses import ResponsesBody


@pytest.mark.parametrize("kind", [[None, None], {}, 0, None])
def test_a_part_type_of_another_json_type_is_refused_not_a_crash(kind: object) -> None:
    with pytest.raises(ValidationError):
        ResponsesBody.model_validate({"model": "m", "input": [{"type": "text", "text": "hi"}, {"type": kind}]})
