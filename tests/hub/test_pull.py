"""Pulls from the stand-in hub with the real huggingface_hub client: what is fetched, at
which revision, with which progress, and how it fails."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.pull import PullCancelled, PullProgress, plan_pull, pull
from modelpool.hub.reference import parse_reference
from modelpool.hub.view import HubView
from tests import hub_repos as r
from tests.hub_standin import HubStandin

GGUF_SIZE = r.smollm2_gguf().stat().st_size


def _pull(text: str, backend: str, access: HubAccess, seen: list[tuple[int, int]] | None = None) -> Path:
    plan = plan_pull(parse_reference(text), backend, access)

    def record(progress: PullProgress) -> None:
        if seen is not None:
            seen.append((progress.done_bytes, progress.total_bytes))

    return pull(plan, access, on_progress=record)


def test_quant_tag_pulls_that_file_only_with_progress(hub_standin: HubStandin, hub_env: Path) -> None:
    seen: list[tuple[int, int]] = []
    before = len(hub_standin.fetched)
    path = _pull(f"hf:{r.GGUF_REPO}:q8_0", "llama_cpp", HubAccess.from_env(), seen)
    assert path.name == r.gguf_name("Q8_0") and path.stat().st_size == GGUF_SIZE
    assert path.is_relative_to(hub_env)
    assert [f.path for f in hub_standin.fetched[before:]] == [r.gguf_name("Q8_0")]  # no other quant, no README
    assert seen[0] == (0, GGUF_SIZE) and seen[-1] == (GGUF_SIZE, GGUF_SIZE)
    assert len(seen) > 3 and [d for d, _ in seen] == sorted(d for d, _ in seen)  # several steps, never back


def test_default_quant_is_q4_k_m(hub_standin: HubStandin, hub_env: Path) -> None:
    plan = plan_pull(parse_reference(r.GGUF_REPO), "llama_cpp", HubAccess.from_env())
    assert plan.files == (r.gguf_name("Q4_K_M"),)
    assert plan.total_bytes == GGUF_SIZE


def test_hf_folder_skips_other_formats(hub_standin: HubStandin, hub_env: Path) -> None:
    before = len(hub_standin.fetched)
    folder = _pull(f"hf:{r.HF_REPO}", "transformers", HubAccess.from_env())
    fetched = {f.path for f in hub_standin.fetched[before:]}
    assert fetched == set(r.HF_WANTED)
    assert sorted(p.name for p in folder.iterdir()) == sorted(r.HF_WANTED)
    assert not (folder / "onnx").exists()


def test_split_gguf_brings_every_part(hub_standin: HubStandin, hub_env: Path) -> None:
    path = _pull(f"hf:{r.SPLIT_REPO}:Q4_1", "llama_cpp", HubAccess.from_env())
    assert path.name == r.SPLIT_PARTS[0]
    assert sorted(p.name for p in path.parent.iterdir()) == list(r.SPLIT_PARTS)


def test_revision_by_tag_and_by_sha(hub_standin: HubStandin, hub_env: Path) -> None:
    old = hub_standin.sha(r.GGUF_REPO, "v1.0")
    access = HubAccess.from_env()
    by_tag = plan_pull(parse_reference(f"hf:{r.GGUF_REPO}@v1.0"), "llama_cpp", access)
    assert by_tag.listing.commit == old and by_tag.files == (r.gguf_name("Q8_0"),)  # the only GGUF back then
    by_sha = plan_pull(parse_reference(f"hf:{r.GGUF_REPO}:Q8_0@{old}"), "llama_cpp", access)
    path = pull(by_sha, access)
    assert path.parent.name == old
    with pytest.raises(ModelSourceError, match="no revision 'v9'"):
        plan_pull(parse_reference(f"hf:{r.GGUF_REPO}@v9"), "llama_cpp", access)
    with pytest.raises(
        ModelSourceError, match=r"no GGUF file with quant tag BF16 \(the repo has: Q4_1, Q4_K_M, Q8_0\)"
    ):
        plan_pull(parse_reference(f"hf:{r.GGUF_REPO}:BF16"), "llama_cpp", access)


def test_gated_repo_without_and_with_a_token(
    hub_standin: HubStandin, hub_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = parse_reference(f"hf:{r.GATED_REPO}")
    plan = plan_pull(ref, "transformers", HubAccess.from_env())  # the listing is public
    with pytest.raises(ModelSourceError, match="is gated: set HF_TOKEN"):
        pull(plan, HubAccess.from_env())
    monkeypatch.setenv("HF_TOKEN", "hf_not_the_right_one")
    with pytest.raises(ModelSourceError, match="HF_TOKEN has no access") as wrong:
        pull(plan, HubAccess.from_env())
    assert "hf_not_the_right_one" not in str(wrong.value)
    monkeypatch.setenv("HF_TOKEN", hub_standin.token)
    before = len(hub_standin.fetched)
    folder = pull(plan, HubAccess.from_env())
    assert (folder / "model.safetensors").is_file()
    assert all(f.authorized for f in hub_standin.fetched[before:] if not f.path.endswith(".safetensors"))


def test_offline_uses_the_cache_or_says_how_to_get_it(
    hub_standin: HubStandin, hub_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match=r"not in the Hugging Face cache.*HF_HUB_OFFLINE") as offline:
        plan_pull(parse_reference(f"hf:{r.HF_REPO}"), "transformers", HubAccess.from_env())
    assert r.HF_REPO in str(offline.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    folder = _pull(f"hf:{r.HF_REPO}", "transformers", HubAccess.from_env())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub_standin.fetched)
    plan = plan_pull(parse_reference(f"hf:{r.HF_REPO}"), "transformers", HubAccess.from_env())
    assert pull(plan, HubAccess.from_env()) == folder and len(hub_standin.fetched) == before


def test_unreachable_endpoint_names_repo_endpoint_and_offline(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HubStandin() as gone:
        endpoint = gone.endpoint
    monkeypatch.setenv("HF_ENDPOINT", endpoint)  # a closed port on loopback
    with pytest.raises(ModelSourceError) as failed:
        plan_pull(parse_reference(f"hf:{r.HF_REPO}"), "transformers", HubAccess.from_env())
    message = str(failed.value)
    assert f"cannot reach {endpoint}" in message and r.HF_REPO in message and "HF_HUB_OFFLINE" in message


def test_cancel_from_another_thread_leaves_no_complete_file(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HubStandin() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        hub.add_commit("standin/held-GGUF", {r.gguf_name("Q4_K_M"): r.smollm2_gguf()})
        gate = hub.hold(r.gguf_name("Q4_K_M"), after_bytes=30_000_000)
        access = HubAccess.from_env()
        plan = plan_pull(parse_reference("hf:standin/held-GGUF"), "llama_cpp", access)
        cancel = threading.Event()
        outcome: list[BaseException] = []
        seen: list[PullProgress] = []

        def run() -> None:
            try:
                pull(plan, access, on_progress=seen.append, cancel=cancel)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        assert gate.reached.wait(30)  # the server paused the body mid-way
        cancel.set()  # from this thread, as an unload does
        gate.release()  # the next chunk reaches the progress hook, which stops the download
        worker.join(30)
        assert not worker.is_alive() and isinstance(outcome[0], PullCancelled)
        assert plan.missing(access) == [r.gguf_name("Q4_K_M")]  # nothing in the snapshot looks complete


def test_hub_view_reads_small_files_and_a_gguf_header(hub_standin: HubStandin, hub_env: Path) -> None:
    access = HubAccess.from_env()
    view = HubView(parse_reference(f"hf:{r.HF_REPO}"), access)
    assert "config.json" in view.names() and "onnx/model.onnx" in view.names()
    assert '"LlamaForCausalLM"' in (view.read_text("config.json", 100_000) or "")
    assert view.read_text("model.safetensors", 1000) is None  # too big to read as text
    gguf = HubView(parse_reference(f"hf:{r.GGUF_REPO}"), access)
    before = len(hub_standin.fetched)
    head = gguf.read_head(r.gguf_name("Q4_1"), 64)
    assert head is not None and head[:4] == b"GGUF" and len(head) == 64
    assert len(hub_standin.fetched) == before + 1  # one ranged GET, not the file
