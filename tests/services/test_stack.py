"""Stack files: validation with clear errors, dependency order, config discovery, placeholders."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from modelpool.errors import ConfigError
from modelpool.services.stack import COMMAND_KIND, MODELPOOL_KIND, load_stack


def write_stack(directory: Path, services: Mapping[str, object], **top: object) -> Path:
    path = directory / "stack.yaml"
    path.write_text(yaml.safe_dump({**top, "services": services}))
    return path


def test_services_come_in_dependency_order_and_configs_are_discovered_by_name(tmp_path: Path) -> None:
    (tmp_path / "llm.yaml").write_text("enabled_models: [smollm2]\n")
    (tmp_path / "custom.yaml").write_text("{}\n")
    path = write_stack(
        tmp_path,
        {
            "app": {"command": ["run-app"], "depends_on": ["llm", "speech"]},
            "speech": {"modelpool": {"config": "custom.yaml", "models": ["whisper-tiny.en"]}, "port": 8200},
            "llm": {"modelpool": {}, "persistent": True},
        },
    )
    stack = load_stack(path)
    assert stack.name == tmp_path.name  # no `name:`: the directory's, as compose does
    assert list(stack.services) == ["llm", "speech", "app"]  # dependencies first, as listed
    llm, speech, app = stack.services["llm"], stack.services["speech"], stack.services["app"]
    assert (llm.kind, speech.kind, app.kind) == (MODELPOOL_KIND, MODELPOOL_KIND, COMMAND_KIND)
    assert llm.config_file == tmp_path / "llm.yaml"  # discovered
    assert speech.config_file == tmp_path / "custom.yaml"  # explicit, relative to the stack file
    assert app.config_file is None  # no app.yaml
    assert (llm.health_path, app.health_path) == ("/readyz", "/health")
    assert llm.start_timeout_s > app.start_timeout_s  # a modelpool may load models before it is ready
    argv = speech.argv("127.0.0.1", 8200, {})
    assert argv[:3] == [sys.executable, "-m", "modelpool"]
    assert argv[3:] == ["serve", "--host", "127.0.0.1", "--port", "8200", "--config", str(tmp_path / "custom.yaml"),
                        "--models", "whisper-tiny.en"]  # fmt: skip
    assert [s.name for s in stack.closure(["app"])] == ["llm", "speech", "app"]
    assert [s.name for s in stack.closure(["llm"])] == ["llm"]


def test_placeholders_fill_own_and_dependency_addresses_and_leave_other_braces(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text("x: 1\n")
    path = write_stack(
        tmp_path,
        {
            "llm": {"modelpool": {}},
            "app": {
                "command": ["app", "--port={port}", "{llm.url}", "{llm.port}", "{config}", '{"json": {"a": 1}}', "{x}"],
                "env": {"LLM": "{llm.url}/v1", "SELF": "{url}"},
                "depends_on": ["llm"],
            },
        },
        name="agent",
    )
    app = load_stack(path).services["app"]
    peers = {"llm": ("http://127.0.0.1:8101", 8101)}
    assert app.argv("127.0.0.1", 8102, peers) == [
        "app", "--port=8102", "http://127.0.0.1:8101", "8101", str(tmp_path / "app.yaml"), '{"json": {"a": 1}}', "{x}",
    ]  # fmt: skip
    assert app.environment("127.0.0.1", 8102, peers) == {
        "LLM": "http://127.0.0.1:8101/v1",
        "SELF": "http://127.0.0.1:8102",
    }


@pytest.mark.parametrize(
    ("services", "message"),
    [
        (
            {"a": {"command": ["x"], "depends_on": ["b"]}, "b": {"command": ["y"], "depends_on": ["a"]}},
            "cycle a -> b -> a",
        ),
        ({"a": {"command": ["x"], "depends_on": ["ghost"]}}, "depends on unknown ghost"),
        ({"a": {"command": ["x"], "modelpool": {}}}, "exactly one of `modelpool` or `command`"),
        ({"a": {}}, "exactly one of `modelpool` or `command`"),
        ({"a": {"command": []}}, "must not be empty"),
        ({"a/b": {"command": ["x"]}}, "may hold only letters"),
        ({"a": {"command": ["x"], "port": 9000}, "b": {"command": ["y"], "port": 9000}}, "share port 9000"),
        ({"a": {"command": ["x"], "port": "any"}}, "services.a.port"),
        ({"a": {"command": ["x"], "colour": "red"}}, "services.a.colour"),
        ({"a": {"modelpool": {"config": "missing.yaml"}}}, "config file not found"),
        ({"a": {"command": ["x"]}, "b": {"command": ["{a.url}"]}}, "uses {a.url} but does not depend on 'a'"),
        ({}, "lists no services"),
    ],
)
def test_a_bad_stack_file_is_refused_with_what_is_wrong(
    tmp_path: Path, services: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match="stack file") as caught:
        load_stack(write_stack(tmp_path, services))
    assert message in caught.value.message


def test_a_missing_or_malformed_stack_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stack file not found"):
        load_stack(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("services: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_stack(tmp_path / "bad.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.yaml is not UTF-8 text"):
        load_stack(tmp_path / "latin1.yaml")
    folder = write_stack(tmp_path, {"app": {"command": ["run-app"]}}, model_backend_file=".")
    with pytest.raises(ConfigError, match=f"cannot read model_backend_file {tmp_path}: Is a directory"):
        load_stack(folder)  # the worker's YAML named as a folder: an error naming it, not a traceback


def test_closure_of_an_unknown_service_is_an_error(tmp_path: Path) -> None:
    stack = load_stack(write_stack(tmp_path, {"a": {"command": ["x"]}}))
    with pytest.raises(ConfigError, match="has no service 'b'"):
        stack.closure(["b"])


def test_model_backend_leaves_out_what_it_replaces_and_its_placeholders_are_refused(tmp_path: Path) -> None:
    services: dict[str, dict[str, object]] = {
        "vlm": {"modelpool": {}, "replaced_by": ["nim"]},
        "worker": {"command": ["run-worker"], "depends_on": ["vlm"]},
    }
    (tmp_path / "worker.yaml").write_text("model_backend: NIM\n")
    path = write_stack(tmp_path, services, model_backend_file="worker.yaml", credentials={"nim": ["NGC_API_KEY"]})
    nim = load_stack(path)
    assert (nim.model_backend, list(nim.services), nim.replaced, nim.credentials) == (
        "nim", ["worker"], ("vlm",), ("NGC_API_KEY",))  # fmt: skip
    assert nim.services["worker"].spec.depends_on == []  # the hosted one is not waited for
    local = load_stack(path, "local")
    assert (list(local.services), local.replaced, local.credentials) == (["vlm", "worker"], (), ())
    services["worker"]["command"] = ["run-worker", "{vlm.url}"]
    with pytest.raises(ConfigError, match=r"uses \{vlm.url\}, but model_backend nim replaces 'vlm'"):
        load_stack(write_stack(tmp_path, services, model_backend="nim"))
    for bad in ({"model_backend": "../x"}, {"credentials": {"nim": ["NOT A NAME"]}}):
        with pytest.raises(ConfigError, match="invalid stack file"):
            load_stack(write_stack(tmp_path, services, **bad))
    with pytest.raises(ConfigError, match="may hold only"):
        load_stack(write_stack(tmp_path, {"w": {"command": ["x"]}}), "no/such")


def test_an_unreadable_config_changes_the_fingerprint_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "llm.yaml").write_text("{}\n")
    llm = load_stack(write_stack(tmp_path, {"llm": {"modelpool": {}}})).services["llm"]
    readable = llm.fingerprint()

    def denied(self: Path) -> bytes:  # as chmod 000 would for a user other than root
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert llm.fingerprint() != readable  # `up` goes on; the server names the file it cannot read
