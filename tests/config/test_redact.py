from __future__ import annotations

import json

from modelpool.config.loader import validate_config
from modelpool.config.redact import REDACTED, redact, redacted_config


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


def test_secret_looking_env_names_and_flags_on_command_lines_are_masked() -> None:
    shown = redact({
        "env": {"OPENAI_KEY": "sk-1", "DB_PASS": "pw@h", "HF_HOME": "/cache"},
        "extra_args": ["--api-key", "sk-2", "--hf-token=hf_3", "--max-model-len", "2048", "--port"],
        "options": {"db_pass": "pw4", "private_key": "pem5", "license_key": "lk6"},
        "max_queue_per_key": 4, "tokens_per_minute": 1000, "cors_allow_credentials": True,
    })  # fmt: skip
    text = json.dumps(shown)
    assert not any(secret in text for secret in ("sk-1", "pw@h", "sk-2", "hf_3", "pw4", "pem5", "lk6"))
    assert shown["env"] == {"OPENAI_KEY": REDACTED, "DB_PASS": REDACTED, "HF_HOME": "/cache"}
    assert shown["extra_args"] == ["--api-key", REDACTED, f"--hf-token={REDACTED}", "--max-model-len", "2048", "--port"]
    assert (shown["max_queue_per_key"], shown["tokens_per_minute"], shown["cors_allow_credentials"]) == (4, 1000, True)
