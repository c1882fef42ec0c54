"""Bounds: a setting out of range is refused before anything is sent, naming the setting."""

from __future__ import annotations

import pytest

from modelpool.loadgen import LoadPlan, LoadSpec, LoadSpecError
from modelpool.loadgen.spec import parse_levels

URL = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("plan", "named"),
    [
        ({"concurrency": (1025,)}, "concurrency"),
        ({"concurrency": (0,)}, "concurrency"),
        ({"concurrency": ()}, "concurrency"),
        ({"concurrency": tuple(range(1, 40))}, "concurrency"),
        ({"requests": 0}, "requests"),
        ({"requests": 10**7}, "requests"),
        ({"requests": None, "duration_s": 0.0}, "duration"),
        ({"requests": None, "duration_s": 10**6}, "duration"),
        ({"requests": None}, "requests/duration"),
        ({"requests": 3, "duration_s": 3.0}, "requests/duration"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_plan_out_of_bounds_is_refused(plan, named):
    with pytest.raises(LoadSpecError, match=f"^{named}"):
        LoadPlan(**plan)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"base_url": "ftp://x"}, "url"),
        ({"model": ""}, "model"),
        ({"kind": "images"}, "kind"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"timeout_s": 0}, "timeout"),
        ({"timeout_s": float("nan")}, "timeout"),
        ({"prompts": ()}, "prompts"),
        ({"prompts": ("",)}, "prompts"),
        ({"kind": "transcription"}, "audio"),
    ],
)
def test_spec_out_of_bounds_is_refused(spec, named):
    with pytest.raises(LoadSpecError, match=f"^{named}"):
        LoadSpec(**{"base_url": URL, "model": "m", **spec})


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:1", "http://h:1/v1/chat/completions"),
        ("http://h:1/", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1", "http://h:1/v1/chat/completions"),
        ("https://h/proxy/v1/", "https://h/proxy/v1/chat/completions"),
    ],
)
def test_url_with_or_without_v1(base, url):
    assert LoadSpec(base, "m").url() == url


def test_levels_parse_and_a_bad_one_names_itself():
    assert parse_levels("1, 4,16") == (1, 4, 16)
    with pytest.raises(LoadSpecError, match="'x'"):
        parse_levels("1,x")


def test_the_key_is_not_in_the_repr():
    assert "sk-secret" not in repr(LoadSpec(URL, "m", api_key="sk-secret"))
