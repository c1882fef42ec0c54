"""What `make install` installs is enough for what the README promises: the project's own
files, read as pip and make read them (a green run on a developer's machine can hide a
missing install step)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test machines run 3.11
    pytest.skip("tomllib needs Python 3.11", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


def installed_extras() -> set[str]:
    """The extras the Makefile's `install` target asks pip for (`pip install -e ".[$(EXTRAS)]"`)."""
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\n$(INSTALLED):", 1)[1].split("\n\n", 1)[0]
    assert '-e ".[$(EXTRAS)]"' in target, "the install target installs the project with its extras"
    found = re.search(r"^EXTRAS := (\S+)$", makefile, re.MULTILINE)
    assert found is not None
    return set(found.group(1).split(","))


def requirements_of(extras: set[str]) -> list[str]:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [requirement for extra in sorted(extras) for requirement in optional[extra]]


def test_make_install_brings_the_llama_cpp_server_that_a_managed_engine_without_binary_runs() -> None:
    requirements = requirements_of(installed_extras())
    assert any(re.match(r"llama-cpp-python\[[^\]]*\bserver\b", r) for r in requirements), requirements


def test_make_install_brings_every_engine_of_the_starter_catalog() -> None:
    extras = installed_extras()
    assert {"llama", "embeddings", "transformers", "speech", "starter"} <= extras


def test_make_install_and_the_all_extra_keep_the_features_of_the_lean_core() -> None:
    """PyAV and the MCP SDK are extras now: `make install` and `[all]` still bring them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]}
    assert {"av", "mcp"} & core == set()
    assert {"audio", "mcp"} <= installed_extras()
    everything = re.search(r"modelpool\[([^\]]+)\]", project["optional-dependencies"]["all"][0])
    assert everything is not None and {"audio", "mcp", "starter", "starter-chat"} <= set(everything.group(1).split(","))


def test_make_install_brings_what_the_ctranslate2_starter_model_runs_on() -> None:
    names = {re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0] for requirement in requirements_of(installed_extras())}
    assert {"ctranslate2", "transformers", "gguf"} <= names, names


def test_make_install_and_the_all_extra_bring_what_server_otel_endpoint_needs() -> None:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "otel" in installed_extras()
    everything = re.search(r"modelpool\[([^\]]+)\]", optional["all"][0])
    assert everything is not None and "otel" in everything.group(1).split(",")
    names = {re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0] for requirement in requirements_of({"otel"})}
    assert names == {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"}


def test_the_package_data_ships_every_workbench_file() -> None:
    """/ui runs from files inside the package: a file the package-data globs miss (a new
    subfolder, say) works from a checkout and is missing from the wheel."""
    from fnmatch import fnmatch

    from modelpool.ui import STATIC_DIR

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["modelpool.ui"]
    files = [path.relative_to(STATIC_DIR.parent).as_posix() for path in STATIC_DIR.rglob("*") if path.is_file()]
    assert files, "the workbench has files"
    # setuptools' `*` does not cross a slash, as fnmatch's does: compare segment counts too.
    shipped = [f for f in files if any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert sorted(shipped) == sorted(files)


def test_the_license_file_is_the_apache_2_text_pyproject_names() -> None:
    """Verbatim: the checksum of the text at apache.org/licenses/LICENSE-2.0.txt (the one
    license scanners such as Yocto's match the file against)."""
    import hashlib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"


def test_the_gpl_voice_engine_is_called_out_where_it_is_installed() -> None:
    """piper-tts is GPL-3.0 while modelpool is Apache-2.0: whoever installs it is told."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    speech = pyproject.split("\nspeech = [", 1)[0].rsplit("\n\n", 1)[-1].split("\n# ctranslate2:", 1)[-1]
    assert "GPL-3.0" in speech, "the comment above the [speech] extra"
    assert "GPL-3.0" in (ROOT / "Makefile").read_text()
    assert "GPL-3.0" in (ROOT / "docs" / "install.md").read_text()
