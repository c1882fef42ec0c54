"""Every YAML block of docs/baselines.md is a config the loader takes, each model's
options valid for its backend (the A/B setup itself runs in tests/e2e/test_baselines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelpool.backends.registry import model_capabilities
from modelpool.config import load_config
from modelpool.tasks import Task
from tests.docs.baselines_page import ab_config, blocks

YAML_BLOCKS = blocks("yaml")


def test_the_page_has_its_configs() -> None:
    assert len(YAML_BLOCKS) >= 4
    assert ab_config()["enabled_models"] == ["smollm2-vllm", "smollm2-tgi"]


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[f"yaml-{i}" for i in range(len(YAML_BLOCKS))])
def test_each_yaml_block_is_a_valid_config(block: str, tmp_path: Path) -> None:
    path = tmp_path / "modelpool.yaml"
    path.write_text(block)
    config = load_config(path, environ={})
    named = [model_id for model_id in config.models if model_id in block]
    assert named, "the block configures no model"
    for model_id in named:
        assert Task.CHAT in model_capabilities(config.models[model_id]).tasks  # options validated by the backend
