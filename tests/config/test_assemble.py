"""Files shipped in parts are joined once into the work dir, checked by sha256 on reuse."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from modelpool.config.assemble import MANIFEST, assembled_folder, read_manifest
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation, locate, model_sources
from modelpool.errors import ModelSourceError

PART_1 = b"first half of the weights;" * 1000
PART_2 = b"second half" * 700


@pytest.fixture
def shipped(tmp_path: Path) -> tuple[Path, dict[str, list[Path]]]:
    """Two 'packages': the first holds part 1, the second part 2 and the other files."""
    one, two = tmp_path / "pkg1", tmp_path / "pkg2"
    one.mkdir()
    two.mkdir()
    (one / "model.bin.part1").write_bytes(PART_1)
    (two / "model.bin.part2").write_bytes(PART_2)
    (two / "config.json").write_text('{"layers": 2}')
    (two / "tokenizer.json").write_text("{}")
    return two, {"model.bin": [one / "model.bin.part1", two / "model.bin.part2"]}


def test_joins_the_parts_once_beside_the_other_files(
    shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, parts = shipped
    with caplog.at_level(logging.INFO, logger="modelpool.config"):
        target = assembled_folder("org/whisper:base", folder, parts, tmp_path / "work")
    assert target.parent == tmp_path / "work" / "assembled" and target.name.startswith("org_whisper_base-")
    assert (target / "model.bin").read_bytes() == PART_1 + PART_2
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST, "config.json", "model.bin", "tokenizer.json"]
    assert (target / "config.json").read_text() == '{"layers": 2}'
    assert read_manifest(target) == {"model.bin": hashlib.sha256(PART_1 + PART_2).hexdigest()}
    assembled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("assembled")]
    assert len(assembled) == 1 and "model.bin from 2 parts" in assembled[0] and str(target) in assembled[0]
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no partial folder left behind

    caplog.clear()
    mtime = (target / "model.bin").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="modelpool.config"):
        assert assembled_folder("org/whisper:base", folder, parts, tmp_path / "work") == target
    assert (target / "model.bin").stat().st_mtime_ns == mtime and not caplog.records  # reused as it was


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_assembly_is_joined_again(
    shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder, parts = shipped
    target = assembled_folder("m", folder, parts, tmp_path / "work")
    joined = target / "model.bin"
    if damage == "truncate":
        joined.write_bytes((PART_1 + PART_2)[:-10])
    elif damage == "flip":
        joined.write_bytes(b"X" + (PART_1 + PART_2)[1:])  # same size, different bytes
    else:
        joined.unlink()
    with caplog.at_level(logging.WARNING, logger="modelpool.config"):
        assert assembled_folder("m", folder, parts, tmp_path / "work") == target
    assert joined.read_bytes() == PART_1 + PART_2
    assert any("assembling it again" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST, "config.json", "model.bin", "tokenizer.json"]


def test_a_lost_manifest_is_rebuilt(shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path) -> None:
    folder, parts = shipped
    target = assembled_folder("m", folder, parts, tmp_path / "work")
    (target / MANIFEST).unlink()
    assembled_folder("m", folder, parts, tmp_path / "work")
    assert read_manifest(target) == {"model.bin": hashlib.sha256(PART_1 + PART_2).hexdigest()}


def test_a_changed_part_gets_a_new_folder(shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path) -> None:
    folder, parts = shipped
    first = assembled_folder("m", folder, parts, tmp_path / "work")
    parts["model.bin"][1].write_bytes(PART_2 + b"!")
    second = assembled_folder("m", folder, parts, tmp_path / "work")
    assert second != first and (second / "model.bin").read_bytes() == PART_1 + PART_2 + b"!"


def test_a_file_name_with_a_path_is_refused(shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path) -> None:
    folder, parts = shipped
    with pytest.raises(ModelSourceError, match="must be a plain file name"):
        assembled_folder("m", folder, {"../model.bin": parts["model.bin"]}, tmp_path / "work")


async def test_locate_assembles_a_models_parts(shipped: tuple[Path, dict[str, list[Path]]], tmp_path: Path) -> None:
    folder, parts = shipped
    assemble = {"model.bin": [str(p) for p in parts["model.bin"]]}
    model = ModelConfig(id="m", backend="faster_whisper", source=str(folder), assemble=assemble)
    assert model_sources(model) == [str(folder), *assemble["model.bin"]]
    path = await locate(model, HubLocation(work_dir=tmp_path / "work"))
    assert path.parent == tmp_path / "work" / "assembled" and (path / "model.bin").read_bytes() == PART_1 + PART_2
    missing = ModelConfig(id="m", backend="faster_whisper", source=str(folder), assemble={"model.bin": ["/no/part"]})
    with pytest.raises(ModelSourceError, match="does not exist"):
        await locate(missing, HubLocation(work_dir=tmp_path / "work"))
    on_a_file = ModelConfig(id="m", backend="faster_whisper", source=str(parts["model.bin"][0]), assemble=assemble)
    with pytest.raises(ModelSourceError, match="must be a folder"):
        await locate(on_a_file, HubLocation(work_dir=tmp_path / "work"))
