"""The reference syntax of layers.md: repo, quant tag, file, revision before or after."""

from __future__ import annotations

import pytest

from modelpool.errors import ModelSourceError
from modelpool.hub.reference import HubReference, Selector, looks_like_reference, parse_reference


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hf:org/repo", HubReference("org/repo")),
        ("org/repo", HubReference("org/repo")),
        ("hf:org/repo:Q4_K_M", HubReference("org/repo", selector=Selector(quant="Q4_K_M"))),
        ("hf:org/repo:q8_0", HubReference("org/repo", selector=Selector(quant="q8_0"))),
        ("hf:org/repo:model.gguf", HubReference("org/repo", selector=Selector(filename="model.gguf"))),
        ("hf:org/repo:sub/dir/model.gguf", HubReference("org/repo", selector=Selector(filename="sub/dir/model.gguf"))),
        ("hf:org/repo@v1.0", HubReference("org/repo", "v1.0")),
        ("hf:org/repo@v1.0:Q4_K_M", HubReference("org/repo", "v1.0", Selector(quant="Q4_K_M"))),
        ("hf:org/repo:Q4_K_M@v1.0", HubReference("org/repo", "v1.0", Selector(quant="Q4_K_M"))),
        ("hf:org/repo:f.gguf@" + "a" * 40, HubReference("org/repo", "a" * 40, Selector(filename="f.gguf"))),
        ("hf:Org-1/Re.po_2@refs/pr/1", HubReference("Org-1/Re.po_2", "refs/pr/1")),
    ],
)
def test_parses(text: str, expected: HubReference) -> None:
    assert parse_reference(text) == expected


def test_prints_back_in_canonical_form() -> None:
    assert str(parse_reference("hf:org/repo:Q4_K_M@v1")) == "hf:org/repo@v1:Q4_K_M"
    assert parse_reference(str(parse_reference("org/repo@main:a/b.gguf"))) == parse_reference("org/repo@main:a/b.gguf")


@pytest.mark.parametrize(
    "text",
    [
        "hf:repo-without-org",
        "hf:a/b/c",
        "hf:org/repo:",
        "hf:org/repo@",
        "hf:org/repo@../../etc",
        "hf:org/repo:../secret.gguf",
        "hf:org/repo:/abs.gguf",
        "hf:org/repo:Q4 K M",
        "hf:org/repo:a\\b.gguf",
        "hf:-org/repo",
        "hf:org/" + "r" * 200,
        "hf:" + "x" * 600,
    ],
)
def test_refuses_with_the_syntax(text: str) -> None:
    with pytest.raises(ModelSourceError, match=r"bad model reference|at most") as raised:
        parse_reference(text)
    assert len(str(raised.value)) < 400  # a long input is not echoed whole


def test_bare_form_only_when_no_such_path(tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    assert looks_like_reference("org/repo:Q4_K_M")
    assert looks_like_reference("hf:org/repo")
    assert not looks_like_reference("./org/repo")
    assert not looks_like_reference("model.gguf")
    (tmp_path / "org").mkdir()  # type: ignore[operator]
    (tmp_path / "org" / "repo").mkdir()  # type: ignore[operator]
    assert not looks_like_reference("org/repo")
