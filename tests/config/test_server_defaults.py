"""`defaults:`: server-wide sampling defaults (precedence: request > model > server >
protocol) and the model a body without `model` uses, both checked as the config loads."""

from __future__ import annotations

import pytest

from modelpool.config import load_config
from modelpool.errors import ConfigError
from modelpool.tasks import Task

CHAT = "smollm2-135m-instruct"


def test_a_model_takes_the_server_defaults_its_own_sampling_leaves_unset() -> None:
    config = load_config(None, environ={}, cli={
        "defaults": {"sampling": {"max_tokens": 128, "temperature": 0.7}},
        "models": {CHAT: {"sampling": {"temperature": 0.2}}},
    })  # fmt: skip
    own = config.models[CHAT].sampling
    assert (own.max_tokens, own.temperature) == (128, 0.2)  # the model's wins over the server's
    other = config.models["all-minilm-l6-v2"].sampling
    assert (other.max_tokens, other.temperature) == (128, 0.7)


def test_a_default_model_must_be_served_and_do_its_task() -> None:
    config = load_config(None, environ={}, cli={"defaults": {"models": {"completion": CHAT, "scoring": CHAT}}})
    assert config.defaults.models == {Task.COMPLETION: CHAT, Task.SCORING: CHAT}
    with pytest.raises(ConfigError, match="'nope' is not a served model"):
        load_config(None, environ={}, cli={"defaults": {"models": {"completion": "nope"}}})
    with pytest.raises(ConfigError, match="is not a served model"):
        load_config(
            None, environ={}, cli={"enabled_models": ["all-minilm-l6-v2"], "defaults": {"models": {"completion": CHAT}}}
        )
    with pytest.raises(ConfigError, match="does not do completion"):
        load_config(
            None, environ={}, cli={"models": {CHAT: {"tasks": ["chat"]}}, "defaults": {"models": {"completion": CHAT}}}
        )
    with pytest.raises(ConfigError, match="without `model` for transcription"):
        load_config(None, environ={}, cli={"defaults": {"models": {"transcription": CHAT}}})
    with pytest.raises(ConfigError):
        load_config(None, environ={}, cli={"defaults": {"sampling": {"max_tokens": 0}}})
