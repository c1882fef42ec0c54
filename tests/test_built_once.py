"""A cache folder built once: several processes building the same folder at the same time
(two test lanes converting one GGUF did exactly this in CI) each get the whole folder, only
one build runs, and nothing half-built is left behind."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from modelpool.built_once import build_lock, building

BUILDERS = 4


def _build_or_reuse(target: Path, log: Path, start: Any) -> None:
    start.wait(timeout=60)  # every process asks for the lock at the same moment
    with build_lock(target):
        if (target / "done").is_file():
            return
        with log.open("a") as record:
            record.write("built\n")
        with building(target) as partial:
            (partial / "half").write_text("x")
            (partial / "done").write_text("x")


def test_processes_building_one_folder_at_once_build_it_once(tmp_path: Path) -> None:
    target, log = tmp_path / "cache" / "model", tmp_path / "builds.log"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(BUILDERS)
    workers = [context.Process(target=_build_or_reuse, args=(target, log, start)) for _ in range(BUILDERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * BUILDERS
    assert log.read_text().splitlines() == ["built"]
    assert sorted(p.name for p in target.iterdir()) == ["done", "half"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["model", "model.lock"]


def test_a_builder_without_the_lock_keeps_the_folder_that_finished_first(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with building(target) as first, building(target) as second:
        (first / "from").write_text("first")
        (second / "from").write_text("second")
    # `second` ends first (the inner block), so its folder is the one kept.
    assert (target / "from").read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(RuntimeError, match="converter broke"), building(target) as partial:
        (partial / "half").write_text("x")
        raise RuntimeError("converter broke")
    assert list(tmp_path.iterdir()) == []
