"""The stand-in hub speaks the protocol the real huggingface_hub client expects: these drive
the client itself against it (listing, revisions, ranges, redirects, the gate), so the pull
tests that build on it test modelpool and not the stand-in."""

from __future__ import annotations

from pathlib import Path

import httpx
import huggingface_hub
import pytest
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from tests import hub_repos as r
from tests.hub_standin import HubStandin


def test_info_and_tree_at_revisions(hub_standin: HubStandin) -> None:
    api = huggingface_hub.HfApi(endpoint=hub_standin.endpoint, token=False)
    main = api.model_info(r.GGUF_REPO, files_metadata=True)
    assert main.sha == hub_standin.sha(r.GGUF_REPO)
    assert {s.rfilename for s in main.siblings or []} == {r.gguf_name(q) for q in r.GGUF_QUANTS} | {"README.md"}
    old = api.model_info(r.GGUF_REPO, revision="v1.0")
    assert old.sha == hub_standin.sha(r.GGUF_REPO, "v1.0") != main.sha
    tree = [
        f.path for f in api.list_repo_tree(r.HF_REPO, recursive=True) if isinstance(f, huggingface_hub.hf_api.RepoFile)
    ]
    assert set(r.HF_WANTED) | set(r.HF_UNWANTED) == set(tree)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(r.GGUF_REPO, revision="v9")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("standin/nothing-here")


def test_downloads_through_the_cdn_with_ranges(hub_standin: HubStandin, tmp_path: Path) -> None:
    path = huggingface_hub.hf_hub_download(
        r.GGUF_REPO,
        r.gguf_name("Q8_0"),
        revision="v1.0",
        endpoint=hub_standin.endpoint,
        cache_dir=tmp_path,
        token=False,
    )
    assert Path(path).read_bytes()[:4] == b"GGUF"
    assert Path(path).stat().st_size == r.smollm2_gguf().stat().st_size
    head = httpx.head(f"{hub_standin.endpoint}/{r.GGUF_REPO}/resolve/main/{r.gguf_name('Q4_1')}")
    assert head.status_code == 302 and head.headers["X-Linked-Size"] == str(Path(path).stat().st_size)
    assert not any(name.lower().startswith("x-xet") for name in head.headers)  # plain HTTP downloads
    ranged = httpx.get(head.headers["Location"], headers={"Range": "bytes=0-3"})
    assert ranged.status_code == 206 and ranged.content == b"GGUF"


def test_gated_repo_needs_the_token(hub_standin: HubStandin, tmp_path: Path) -> None:
    def fetch(token: str | bool) -> str:
        return huggingface_hub.hf_hub_download(
            r.GATED_REPO, "config.json", endpoint=hub_standin.endpoint, cache_dir=tmp_path, token=token
        )

    with pytest.raises(GatedRepoError, match="401"):
        fetch(False)
    with pytest.raises(GatedRepoError, match="403"):
        fetch("hf_wrong")
    assert Path(fetch(hub_standin.token)).is_file()


def test_split_gguf_is_real(hub_standin: HubStandin, tmp_path: Path) -> None:
    """llama.cpp loads the two parts as one model from the first."""
    import llama_cpp

    folder = huggingface_hub.snapshot_download(
        r.SPLIT_REPO, endpoint=hub_standin.endpoint, cache_dir=tmp_path, allow_patterns=["*-of-*.gguf"], token=False
    )
    assert sorted(p.name for p in Path(folder).iterdir()) == list(r.SPLIT_PARTS)
    model = llama_cpp.Llama(model_path=str(Path(folder) / r.SPLIT_PARTS[0]), n_ctx=64, verbose=False)
    try:
        out = model.create_completion("The capital of France is", max_tokens=4, temperature=0)
        assert out["choices"][0]["text"].strip()  # type: ignore[index]
    finally:
        model.close()


def test_hold_pauses_a_body_until_released(tmp_path: Path) -> None:
    with HubStandin() as hub:
        hub.add_commit("standin/held", {"w.safetensors": b"x" * 3_000_000})
        gate = hub.hold("w.safetensors", after_bytes=1_000_000)
        location = httpx.head(f"{hub.endpoint}/standin/held/resolve/main/w.safetensors").headers["Location"]
        with httpx.stream("GET", location) as response:
            stream = response.iter_bytes()
            first = next(stream)
            assert gate.reached.wait(10)
            gate.release()
            assert len(first) + sum(len(c) for c in stream) == 3_000_000
