"""Hugging Face model references: `hf:org/repo[@rev][:selector][@rev]`.

    hf:org/repo                   the repo; the backend's files (`select.files_for`)
    hf:org/repo:Q4_K_M            a quant tag: the GGUF file(s) whose name carries it
    hf:org/repo:path/file.gguf    one file (the old `hf:org/repo:file` form)
    hf:org/repo@v1.0:Q4_K_M       at a revision (a branch, a tag or a commit sha) ...
    hf:org/repo:Q4_K_M@v1.0       ... also accepted at the very end

A selector with a `.` or a `/` is a file; anything else is a quant tag (Q4_K_M, q8_0,
IQ2_XS, BF16), matched case-insensitively in file names. The CLI also takes the same text
without `hf:` when it looks like `org/repo…` and is not a path on disk (`looks_like_reference`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from modelpool.errors import ModelSourceError

HF_PREFIX = "hf:"
MAX_REFERENCE_CHARS = 512
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO = re.compile(rf"{_NAME}/{_NAME}")
_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,255}")
_QUANT = re.compile(r"[A-Za-z0-9_]{1,32}")


@dataclass(frozen=True)
class Selector:
    """What to take from a repo: one file, a quant tag, or (both None) the backend's default."""

    filename: str | None = None
    quant: str | None = None


@dataclass(frozen=True)
class HubReference:
    repo_id: str
    revision: str | None = None
    selector: Selector = Selector()

    @property
    def filename(self) -> str | None:
        return self.selector.filename

    @property
    def quant(self) -> str | None:
        return self.selector.quant

    def __str__(self) -> str:
        text = HF_PREFIX + self.repo_id + (f"@{self.revision}" if self.revision else "")
        chosen = self.selector.filename or self.selector.quant
        return text + (f":{chosen}" if chosen else "")


def parse_reference(text: str) -> HubReference:
    """`hf:org/repo[@rev][:selector][@rev]` (the `hf:` optional) → a HubReference.
    ModelSourceError says what is wrong and what the syntax is."""
    if len(text) > MAX_REFERENCE_CHARS:
        raise ModelSourceError(f"a model reference is at most {MAX_REFERENCE_CHARS} characters")
    body = text[len(HF_PREFIX) :] if text.startswith(HF_PREFIX) else text
    head, colon, selector_text = body.partition(":")
    repo_id, at, revision = head.partition("@")
    if colon and not at and "@" in selector_text:
        selector_text, _, revision = selector_text.rpartition("@")
        at = "@"
    if not _REPO.fullmatch(repo_id):
        raise _bad(text, f"'{_short(repo_id)}' is not an org/repo name")
    if at and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise _bad(text, f"'{_short(revision)}' is not a revision (a branch, tag or commit sha)")
    if colon and not selector_text:
        raise _bad(text, "nothing after ':'")
    return HubReference(repo_id, revision or None, _selector(text, selector_text) if colon else Selector())


def looks_like_reference(text: str) -> bool:
    """True for `hf:…`, or `org/repo…` that is no path on disk (the CLI's bare form)."""
    if text.startswith(HF_PREFIX):
        return True
    if text.startswith((".", "/", "~")) or Path(text).exists():
        return False
    head = re.split(r"[:@]", text, maxsplit=1)[0]
    return _REPO.fullmatch(head) is not None


def _selector(text: str, selector: str) -> Selector:
    if "." in selector or "/" in selector:
        parts = selector.split("/")
        if any(part in ("", ".", "..") for part in parts) or "\\" in selector or len(selector) > 255:
            raise _bad(text, f"'{_short(selector)}' is not a file in the repo")
        return Selector(filename=selector)
    if not _QUANT.fullmatch(selector):
        raise _bad(text, f"'{_short(selector)}' is neither a file nor a quant tag such as Q4_K_M")
    return Selector(quant=selector)


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(text: str, why: str) -> ModelSourceError:
    shown = _short(text)
    return ModelSourceError(
        f"bad model reference '{shown}': {why}. Write hf:org/repo, hf:org/repo:Q4_K_M (a quant tag), "
        "hf:org/repo:file.gguf, with @revision after the repo or at the end"
    )
