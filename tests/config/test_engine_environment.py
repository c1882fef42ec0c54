"""What an engine process gets of modelpool's environment."""

from __future__ import annotations

import pytest

from modelpool.config.environment import engine_environment


def test_proxies_ca_bundles_and_allocator_settings_reach_engines_secrets_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passed = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "localhost", "SSL_CERT_FILE": "/etc/ca.pem",
              "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind"}  # fmt: skip
    withheld = {"HF_TOKEN": "hf_secret", "MODELPOOL_APP_KEY": "sk-secret", "VLLM_API_KEY": "x", "HOST": "0.0.0.0"}
    for name, value in {**passed, **withheld}.items():
        monkeypatch.setenv(name, value)
    env = engine_environment({})
    assert {name: env.get(name) for name in passed} == passed
    assert set(withheld) & set(env) == set()
    assert engine_environment({}, passed=["HF_TOKEN"])["HF_TOKEN"] == "hf_secret"  # named in options.pass_env
