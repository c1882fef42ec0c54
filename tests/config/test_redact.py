from __future__ import annotations

import json

from modelpool.config.loader import validate_config
from modelpool.config.redact import REDACTED, redacted_config


def test_secrets_are_redacted_and_env_var_names_kept() -> None:
    config = validate_config(
        {
            "starter_models": False,
            "models": {
                "remote": {
                    "backend": "llama_cpp",
                    "source": "/x",
                    "options": {
                        "api_key": "sk-very-secret",
                        "api_key_env": "OPENAI_KEY",
                        "headers": {"Authorization": "Bearer abc"},
                        "max_tokens": 5,
                    },
                }
            },
        }
    )
    shown = redacted_config(config)
    options = shown["models"]["remote"]["options"]
    assert options["api_key"] == REDACTED and options["headers"]["Authorization"] == REDACTED
    assert options["api_key_env"] == "OPENAI_KEY" and options["max_tokens"] == 5
    assert "sk-very-secret" not in json.dumps(shown) and "Bearer abc" not in json.dumps(shown)
