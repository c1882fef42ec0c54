"""What we publish about the config stays true: the JSON schema, the examples, the reference in docs/."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from modelpool.cli.reference import END, START, reference_markdown
from modelpool.config import load_config
from modelpool.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_published_schema_is_current() -> None:
    published = json.loads((ROOT / "docs" / "config.schema.json").read_text())
    assert published == Config.model_json_schema(), "run: modelpool config-schema > docs/config.schema.json"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_schema(example: Path) -> None:
    schema = Config.model_json_schema()
    # Entries under `models:` may be partial (they merge onto the starter catalog), so no
    # field of theirs is required here; unknown fields and wrong types still fail.
    schema["$defs"]["ModelConfig"]["required"] = []
    jsonschema.validate(yaml.safe_load(example.read_text()), schema)
    broken = {"server": {"prot": 8000}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_example_config_loads_with_its_local_override() -> None:
    config = load_config(ROOT / "examples" / "modelpool.yaml", environ={})
    assert config.server.port == 8001  # from modelpool.local.yaml beside it
    assert config.models["smollm2-135m-instruct"].options == {"n_ctx": 2048, "reuse_prompt_cache": True}
    assert config.models["qwen2.5-0.5b-instruct"].options["n_gpu_layers"] == 0
    assert config.models["qwen2.5-0.5b-instruct"].preload is False


def test_config_reference_is_current() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    block = page.split(START, 1)[1].split(END, 1)[0]
    assert block.strip() == reference_markdown().strip(), "run: make docs (modelpool config-reference --doc ...)"


def test_config_reference_covers_every_section() -> None:
    """The sections the config file may hold are all in the reference, nested ones too."""
    titles = {line for line in reference_markdown().splitlines() if line.startswith("### ")}
    for section in ("`server:`", "`pool:`", "`auth:`", "`auth: keys[]:`", "`ray:`", "`ray: groups: <name>:`",
                    "`models: <id>:`", "`models: <id>: batch:`", "`models: <id>: sampling:`", "`models: <id>: ray:`"):
        assert f"### {section}" in titles
