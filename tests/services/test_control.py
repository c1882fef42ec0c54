"""Targeting running services: by id or name, never guessing; stop order; logs of stopped ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelpool.services.control import AmbiguousService, find_log, resolve, stop_order
from modelpool.services.pids import create_time
from modelpool.services.registry import Registry, ServiceRecord


def record(stack: str, name: str, port: int, *, depends_on: tuple[str, ...] = (), offset: float = 0) -> ServiceRecord:
    """A record of this very test process (alive, so the registry keeps it)."""
    started = (create_time(os.getpid()) or 0.0) + offset
    return ServiceRecord(
        id=f"{stack}/{name}@{port}", name=name, kind="command", pid=os.getpid(), port=port,
        url=f"http://127.0.0.1:{port}", started_at=started, stack=stack, extra={"depends_on": list(depends_on)},
    )  # fmt: skip


def test_a_name_shared_by_two_running_services_is_refused_with_both_listed(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.put(record("one", "llm", 8100))
    registry.put(record("two", "llm", 8101))
    registry.put(record("two", "tts", 8102))
    with pytest.raises(AmbiguousService) as caught:
        resolve(registry, "llm")
    assert "one/llm@8100" in caught.value.message and "two/llm@8101" in caught.value.message
    assert "http://127.0.0.1:8101" in caught.value.message and "started" in caught.value.message
    assert resolve(registry, "two/llm@8101").port == 8101  # type: ignore[union-attr]  # the id
    assert resolve(registry, "one/llm").port == 8100  # type: ignore[union-attr]  # stack/name
    assert resolve(registry, "tts").port == 8102  # type: ignore[union-attr]  # a unique name
    assert resolve(registry, "stt") is None


def test_dependents_stop_before_what_they_depend_on() -> None:
    llm = record("s", "llm", 1, offset=-0.5)
    app = record("s", "app", 2, depends_on=("llm", "tts"), offset=-0.9)  # oldest, yet first
    tts = record("s", "tts", 3, offset=-0.1)
    other = record("t", "llm", 4, offset=-0.2)  # another stack's llm: app does not need it
    order = [r.id for r in stop_order([llm, tts, app, other])]
    assert order.index("s/app@2") < order.index("s/llm@1")
    assert order.index("s/app@2") < order.index("s/tts@3")
    assert order[0] == "t/llm@4"  # free of dependents, newest first


def test_the_log_of_a_stopped_service_is_found_by_name(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    (tmp_path / "logs" / "agent").mkdir(parents=True)
    (tmp_path / "logs" / "agent" / "llm.log").write_text("hello\n")
    path, running = find_log(registry, "llm")
    assert path == tmp_path / "logs" / "agent" / "llm.log" and running is None
    (tmp_path / "logs" / "other").mkdir()
    (tmp_path / "logs" / "other" / "llm.log").write_text("hi\n")
    with pytest.raises(AmbiguousService, match="agent/llm"):
        find_log(registry, "llm")
    assert find_log(registry, "other/llm")[0] == tmp_path / "logs" / "other" / "llm.log"
