"""docs/baselines.md's A/B setup, for real: two OpenAI-compatible upstreams
(llama-cpp-python's `python -m llama_cpp.server` on the starter GGUF, standing in for vLLM
and TGI, each under the model name the page gives it) behind one `modelpool serve` whose
config is the page's block with only the two ports changed. Both arms answer through one
base URL with the official `openai` SDK, the same as asking each upstream directly (the
fields of the page's mapping table are forwarded: max tokens, stop, seed, temperature);
TGI's own field names are refused by modelpool with a 400; the page's Python example runs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai.types.chat import ChatCompletion

from tests.docs.baselines_page import ab_config, blocks
from tests.e2e.conftest import smollm2_gguf
from tests.processes import Server, llama_cpp_server, modelpool_serve

DOC_URLS = {"smollm2-vllm": "http://127.0.0.1:8001/v1", "smollm2-tgi": "http://127.0.0.1:8002/v1"}
DOC_BASE_URL = "http://127.0.0.1:8000/v1"
ARMS = tuple(DOC_URLS)
Client = Callable[[str], openai.OpenAI]
PROMPT: list[Any] = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]


@pytest.fixture(scope="module")
def ab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Server]]]:
    """The two stand-in upstreams, and modelpool configured as the page says."""
    folder = tmp_path_factory.mktemp("baselines")
    config = ab_config()
    models: dict[str, Any] = config["models"]  # type: ignore[assignment]
    with (
        llama_cpp_server(folder / "vllm.log", smollm2_gguf(), upstream_name("smollm2-vllm")) as vllm,
        llama_cpp_server(folder / "tgi.log", smollm2_gguf(), upstream_name("smollm2-tgi")) as tgi,
    ):  # fmt: skip
        upstreams = {"smollm2-vllm": vllm, "smollm2-tgi": tgi}
        for arm, server in upstreams.items():
            assert models[arm]["options"]["base_url"] == DOC_URLS[arm]  # the page's, replaced below
            models[arm]["options"]["base_url"] = f"{server.url}/v1"
        (folder / "baselines.yaml").write_text(yaml.safe_dump(config))
        with modelpool_serve(folder / "modelpool.log", "--config", str(folder / "baselines.yaml")) as front:
            yield front, upstreams


@pytest.fixture
def client() -> Iterator[Callable[[str], openai.OpenAI]]:
    """An SDK client on a server's URL; every one made is closed when the test ends."""
    with contextlib.ExitStack() as made:

        def on(url: str) -> openai.OpenAI:
            return made.enter_context(openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120))

        yield on


def upstream_name(arm: str) -> str:
    """The model name the page's entry asks its upstream for (`upstream_model`)."""
    models: dict[str, Any] = ab_config()["models"]  # type: ignore[assignment]
    return str(models[arm]["options"]["upstream_model"])


def answer(sdk: openai.OpenAI, model: str, **fields: Any) -> ChatCompletion:
    return sdk.chat.completions.create(model=model, messages=PROMPT, stream=False, **fields)


def test_one_base_url_lists_and_answers_both_arms(ab: tuple[Server, dict[str, Server]], client: Client) -> None:
    front, upstreams = ab
    sdk = client(front.url)
    assert {m.id for m in sdk.models.list().data} == set(ARMS)
    for arm, upstream in upstreams.items():
        direct_sdk, name = client(upstream.url), upstream_name(arm)
        via = answer(sdk, arm, temperature=0, max_tokens=24, seed=7)
        direct = answer(direct_sdk, name, temperature=0, max_tokens=24, seed=7)
        assert via.model == arm and via.choices[0].message.content
        # Greedy with the same limits: the upstream's own answer, word for word.
        assert via.choices[0].message.content == direct.choices[0].message.content
        assert via.usage is not None and direct.usage is not None
        assert via.usage.completion_tokens == direct.usage.completion_tokens <= 24
        # Sampled with a seed: the same draw only when seed, temperature and top_p reach it (top_p
        # given: modelpool always sends one, 1.0 when left out, where llama.cpp's default is 0.95).
        sampled = {"temperature": 1.5, "top_p": 0.95, "max_tokens": 24}
        via_sampled = answer(sdk, arm, seed=1234, **sampled).choices[0].message.content
        assert via_sampled == answer(direct_sdk, name, seed=1234, **sampled).choices[0].message.content
        assert via_sampled != answer(sdk, arm, seed=4321, **sampled).choices[0].message.content


def test_the_mapped_fields_reach_the_upstream(ab: tuple[Server, dict[str, Server]], client: Client) -> None:
    front, _ = ab
    sdk = client(front.url)
    for arm in ARMS:
        capped = sdk.chat.completions.create(model=arm, messages=PROMPT, temperature=0, max_completion_tokens=3)
        assert capped.usage is not None and capped.usage.completion_tokens <= 3
        assert capped.choices[0].finish_reason == "length"
        whole = sdk.chat.completions.create(model=arm, messages=PROMPT, temperature=0, max_tokens=40)
        text = whole.choices[0].message.content or ""
        stop = text[len(text) // 2 :][:3]  # three characters from the middle of the greedy answer
        assert len(text) >= 8 and stop.strip(), text
        stopped = sdk.chat.completions.create(model=arm, messages=PROMPT, temperature=0, max_tokens=40, stop=[stop])
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].message.content == text[: text.index(stop)]  # cut before the stop


@pytest.mark.parametrize("field", [{"max_new_tokens": 8}, {"do_sample": False}, {"stop_sequences": [","]}])
def test_tgi_s_own_field_names_are_a_clear_400(
    ab: tuple[Server, dict[str, Server]], client: Client, field: dict[str, Any]
) -> None:
    front, _ = ab
    with pytest.raises(openai.BadRequestError) as refused:
        client(front.url).chat.completions.create(model="smollm2-tgi", messages=PROMPT, extra_body=field)
    assert next(iter(field)) in refused.value.message


def test_the_page_s_python_example_runs_against_it(ab: tuple[Server, dict[str, Server]], tmp_path: Path) -> None:
    front, _ = ab
    (example,) = [b for b in blocks("python") if DOC_BASE_URL in b]
    script = tmp_path / "example.py"
    script.write_text(example.replace(DOC_BASE_URL, f"{front.url}/v1"))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    printed = ran.stdout.strip().splitlines()
    assert [line.split(" ", 1)[0] for line in printed] == list(ARMS)
    assert all(len(line.split(" ", 1)) == 2 for line in printed)  # each arm answered something
