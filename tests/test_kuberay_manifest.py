"""deploy/kuberay/ cannot be run here (no Kubernetes): these checks keep it in step with the
code and with deploy/kuberay/modelpool.yaml instead. No Ray import, except in the last test,
which validates the serve config against Ray Serve's own schema when Ray is installed."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelpool.config.loader import load_config
from modelpool.config.schema import Config
from modelpool.ray_serve.options import HEAD_NODE_RESOURCE, ingress_options
from modelpool.ray_serve.serve_config import serve_config_v2
from tests.containers.host import make_image_tag

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
CONFIG_FILE = KUBERAY / "modelpool.yaml"
CONFIG_PATH = "/etc/modelpool/modelpool.yaml"  # where the pods mount it (rayservice.yaml)
CONFIG_HASH_ANNOTATION = "modelpool/config-sha256"


@pytest.fixture(scope="module")
def config() -> Config:
    # environ={}: the file alone, as in a pod (whose only env vars are the API keys).
    return load_config(CONFIG_FILE, environ={})


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    data = yaml.safe_load((KUBERAY / "rayservice.yaml").read_text("utf-8"))
    assert data["apiVersion"] == "ray.io/v1"
    assert data["kind"] == "RayService"
    return dict(data)


@pytest.fixture(scope="module")
def configmap() -> dict[str, Any]:
    data = yaml.safe_load((KUBERAY / "configmap.yaml").read_text("utf-8"))
    assert data["apiVersion"] == "v1"
    assert data["kind"] == "ConfigMap"
    return dict(data)


def cluster(manifest: dict[str, Any]) -> dict[str, Any]:
    return dict(manifest["spec"]["rayClusterConfig"])


def groups(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every node group of the cluster by name (the head group as `head`)."""
    spec = cluster(manifest)
    found = {"head": spec["headGroupSpec"]}
    for group in spec.get("workerGroupSpecs", []):
        found[group["groupName"]] = group
    return found


def ray_container(group: dict[str, Any]) -> dict[str, Any]:
    """KubeRay runs Ray in a pod's first container."""
    return dict(group["template"]["spec"]["containers"][0])


def offered_resources(group: dict[str, Any], *, head: bool = False) -> dict[str, float]:
    """The custom resources `ray start` gives the group's nodes: KubeRay takes
    `rayStartParams.resources` as a JSON object quoted as a JSON string ('"{\\"head\\": 1}"');
    and on the head, the resource Ray gives the head node alone."""
    offered = {HEAD_NODE_RESOURCE: 1.0} if head else {}
    raw = group.get("rayStartParams", {}).get("resources")
    if raw is None:
        return offered
    unquoted = json.loads(raw)
    assert isinstance(unquoted, str), f"rayStartParams.resources must be a quoted JSON string, got {raw!r}"
    resources = json.loads(unquoted)
    assert isinstance(resources, dict)
    return {**offered, **{str(name): float(amount) for name, amount in resources.items()}}


def wanted_resources(config: Config) -> dict[str, dict[str, float]]:
    """Custom resources each deployment of the config asks for (ingress, models, groups)."""
    wanted = {"ray.ingress": dict(ingress_options(config)["ray_actor_options"].get("resources", {}))}
    for model in config.served_models():
        if model.ray is not None and model.ray.group is None:
            wanted[f"models.{model.id}.ray"] = dict(model.ray.ray_actor_options.resources)
    for name, group in config.ray.groups.items():
        wanted[f"ray.groups.{name}"] = dict(group.ray_actor_options.resources)
    return wanted


def hosts(manifest: dict[str, Any], resources: dict[str, float]) -> list[str]:
    """The node groups whose nodes offer every one of `resources` (at least the amount asked)."""
    return [
        name
        for name, group in groups(manifest).items()
        if all(offered_resources(group, head=name == "head").get(key, 0) >= amount for key, amount in resources.items())
    ]


def pinned_ray_version() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    (spec,) = [s for s in pyproject["project"]["optional-dependencies"]["ray"] if s.startswith("ray")]
    match = re.fullmatch(r"ray\[[a-z,]*serve[a-z,]*\]==([0-9][0-9A-Za-z.]*)", spec.replace(" ", ""))
    assert match, f"pyproject's ray extra should pin ray[serve]==X.Y.Z, has {spec!r}"
    return match.group(1)


# ----- (a) serveConfigV2 is what `modelpool ray serve-config` prints -------------------------------


def test_serve_config_v2_is_the_generated_one(config: Config, manifest: dict[str, Any]) -> None:
    text = manifest["spec"]["serveConfigV2"]
    assert isinstance(text, str), "spec.serveConfigV2 must be a YAML string (a `|` block), as KubeRay takes it"
    assert yaml.safe_load(text) == serve_config_v2(config, CONFIG_PATH), (
        "deploy/kuberay/rayservice.yaml is out of step: paste the output of `modelpool ray serve-config "
        f"--config deploy/kuberay/modelpool.yaml --config-path {CONFIG_PATH}` into spec.serveConfigV2"
    )


def test_every_served_model_has_an_application(config: Config, manifest: dict[str, Any]) -> None:
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    names = {app["name"] for app in served["applications"]}
    assert names == {
        "modelpool",
        "mp-smollm2-135m-instruct",
        "mp-all-minilm-l6-v2",
        "mpg-speech",
    }
    assert {m.id for m in config.served_models()} == {
        "smollm2-135m-instruct",
        "all-minilm-l6-v2",
        "whisper-tiny.en",
        "piper-en-us-joe",
    }


def test_the_serve_port_is_the_head_containers(manifest: dict[str, Any]) -> None:
    """KubeRay's serve Service targets the head container's port named `serve`."""
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    ports = {p["name"]: p["containerPort"] for p in ray_container(groups(manifest)["head"])["ports"]}
    assert ports == {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": served["http_options"]["port"]}


# ----- (b) one Ray version everywhere ------------------------------------------------------------


def test_ray_version_is_the_pinned_one(manifest: dict[str, Any]) -> None:
    pinned = pinned_ray_version()
    assert cluster(manifest)["rayVersion"] == pinned
    images = {ray_container(group)["image"] for group in groups(manifest).values()}
    assert images == {make_image_tag("image-ray")}, "the pods should run what `make image-ray` tags"
    assert next(iter(images)).endswith(f"-ray{pinned}")


def test_the_ray_image_is_the_root_dockerfiles_ray_target() -> None:
    """One Dockerfile for every image: its `ray` stage installs pyproject's `ray` extra (the pin
    checked above) on top of the runtime; tests/containers/test_image.py builds it and asks
    the image for its Ray version."""
    assert not (KUBERAY / "Dockerfile").exists(), "the KubeRay image comes from the root Dockerfile"
    dockerfile = (ROOT / "Dockerfile").read_text("utf-8")
    stage = dockerfile.split("FROM runtime AS ray", 1)[1].split("\nFROM ", 1)[0]
    assert "requirements.py /build/pyproject.toml ray --extras-only" in stage
    assert "-c /build/constraints.txt" in stage
    make = ["make", "-s", "-n", "image-ray", "CONTAINER_CLI=docker"]
    assert "--target ray" in subprocess.run(make, cwd=ROOT, capture_output=True, text=True, check=True).stdout


# ----- (c) every custom resource asked for is offered ---------------------------------------------


def test_every_custom_resource_is_offered(config: Config, manifest: dict[str, Any]) -> None:
    wanted = wanted_resources(config)
    assert any(wanted.values()), "the config pins nothing: this check would prove nothing"
    for where, resources in wanted.items():
        assert hosts(manifest, resources), f"{where} asks for {resources}: no node group offers them"


def test_ingress_runs_on_the_head_and_models_on_workers(config: Config, manifest: dict[str, Any]) -> None:
    wanted = wanted_resources(config)
    assert HEAD_NODE_RESOURCE in wanted["ray.ingress"], "the ingress should be pinned to the head (ray.ingress.on_head)"
    assert hosts(manifest, wanted.pop("ray.ingress")) == ["head"]
    for where, resources in wanted.items():
        assert resources, f"{where}: give it a custom resource so it stays off the head pod"
        assert "head" not in hosts(manifest, resources), f"{where} could land on the head pod"


def test_workers_autoscale(manifest: dict[str, Any]) -> None:
    spec = cluster(manifest)
    assert spec["enableInTreeAutoscaling"] is True
    (models,) = spec["workerGroupSpecs"]
    assert models["groupName"] == "models"
    assert (models["minReplicas"], models["maxReplicas"]) == (1, 4)


def test_head_has_cpus_for_the_ingress(config: Config, manifest: dict[str, Any]) -> None:
    """KubeRay sets `--num-cpus` from the CPU limit unless rayStartParams says; not 0."""
    head = groups(manifest)["head"]
    cpus = head["rayStartParams"].get("num-cpus") or ray_container(head)["resources"]["limits"]["cpu"]
    assert float(cpus) >= config.ray.ingress.ray_actor_options.num_cpus * config.ray.ingress.num_replicas
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # KubeRay submits serveConfigV2 through it


# ----- (d) the ConfigMap is modelpool.yaml, mounted where the applications read it -----------------


def test_configmap_holds_modelpool_yaml(configmap: dict[str, Any]) -> None:
    assert configmap["metadata"]["name"] == "modelpool-config"
    assert configmap["data"] == {"modelpool.yaml": CONFIG_FILE.read_text("utf-8")}, (
        "deploy/kuberay/configmap.yaml is out of step with modelpool.yaml: regenerate it (docs/ray.md)"
    )


def test_every_pod_mounts_the_config(configmap: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Ray Serve may build an application (which reads args.config) on any node."""
    folder, _, file_name = CONFIG_PATH.rpartition("/")
    assert file_name in configmap["data"]
    for name, group in groups(manifest).items():
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for m in ray_container(group)["volumeMounts"] if m["mountPath"] == folder]
        assert len(mounts) == 1, f"{name}: nothing mounted at {folder}"
        volume = volumes[mounts[0]["name"]]
        assert volume["configMap"]["name"] == configmap["metadata"]["name"], name


def test_pods_roll_when_the_config_changes(manifest: dict[str, Any]) -> None:
    """Ray Serve rebuilds an application only when its import_path or args change, and the
    args hold the config's path, not its content: the pods carry the content's hash, so a
    config change changes the cluster spec and KubeRay rolls a new cluster."""
    digest = hashlib.sha256(CONFIG_FILE.read_bytes()).hexdigest()
    for name, group in groups(manifest).items():
        annotations = group["template"].get("metadata", {}).get("annotations", {})
        assert annotations.get(CONFIG_HASH_ANNOTATION) == digest, (
            f"{name}: set the pod annotation {CONFIG_HASH_ANNOTATION} to `sha256sum deploy/kuberay/modelpool.yaml`"
        )


# ----- (e) API keys come from a Secret, into the pods that check them ------------------------------


def test_api_keys_come_from_a_secret(config: Config, manifest: dict[str, Any]) -> None:
    key_envs = {key.key_env for key in config.auth.keys if key.key_env is not None}
    assert key_envs, "the cluster's config should need API keys (it serves on 0.0.0.0)"
    ingress_hosts = hosts(manifest, wanted_resources(config)["ray.ingress"])
    assert ingress_hosts
    for name in ingress_hosts:
        env = {e["name"]: e for e in ray_container(groups(manifest)[name]).get("env", [])}
        for variable in sorted(key_envs):
            assert variable in env, f"{name} (where the ingress runs) lacks the API key variable {variable}"
            assert "secretKeyRef" in env[variable].get("valueFrom", {}), f"{name}: {variable} must come from a Secret"
            assert "value" not in env[variable], f"{name}: {variable} must not be written into the manifest"


def test_pod_environment_is_no_config_override(config: Config, manifest: dict[str, Any]) -> None:
    """The loader reads MODELPOOL_* variables that spell a config path as overrides: the
    pods' own variables must load to the same config."""
    for name, group in groups(manifest).items():
        environ = {e["name"]: "a-secret-value" for e in ray_container(group).get("env", [])}
        assert load_config(CONFIG_FILE, environ=environ) == config, name


# ----- Ray Serve's own schema accepts the serve config ---------------------------------------------


def test_ray_serve_schema_accepts_the_serve_config(manifest: dict[str, Any]) -> None:
    with warnings.catch_warnings():  # Ray's pydantic models use deprecated Field arguments
        warnings.simplefilter("ignore", DeprecationWarning)
        schema = pytest.importorskip("ray.serve.schema", reason="Ray mode is optional: make install-ray")
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    parsed = schema.ServeDeploySchema.model_validate(served)
    # Ray ignores fields it does not know: every field must come back, or Ray would drop it.
    assert parsed.model_dump(exclude_unset=True) == served


# ----- (f) Ray's own ports are closed to other pods (networkpolicy.yaml) ---------------------------

OTHER_RAY_PORTS = [52365, 8080, 44217, 44227, 10002, 19999, 6380]
"""Ports a Ray node opens besides its container's named ones: the dashboard agent, metrics
export, fixed ports seen on every node (RAY.md), the ends of the worker port range, a GCS
moved off 6379."""


@dataclass
class Peer:
    """A pod that opens a connection: its labels, and its namespace's labels (None: the
    namespace of the RayService and its policy)."""

    labels: dict[str, str]
    namespace: dict[str, str] | None = None


@pytest.fixture(scope="module")
def network_policy() -> dict[str, Any]:
    data = yaml.safe_load((KUBERAY / "networkpolicy.yaml").read_text("utf-8"))
    assert (data["apiVersion"], data["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    return dict(data)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector; only matchLabels, so that this reading of the policy stays whole."""
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is read here: {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def admits(source: dict[str, Any], peer: Peer) -> bool:
    """Kubernetes' reading of one `from` entry: a podSelector alone means the policy's own
    namespace; with a namespaceSelector, pods of the namespaces it selects."""
    assert "ipBlock" not in source, "an ipBlock is not read here"
    if "namespaceSelector" in source:
        in_namespace = selects(source["namespaceSelector"], peer.namespace or {})
    else:
        in_namespace = peer.namespace is None
    return in_namespace and selects(source.get("podSelector", {}), peer.labels)


def reaches(policy: dict[str, Any], peer: Peer, port: int) -> bool:
    """Whether `peer` may open TCP `port` on the pods the policy selects."""
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports", [])
        assert all(p.get("protocol", "TCP") == "TCP" and "endPort" not in p for p in ports), ports
        if ports and port not in [p["port"] for p in ports]:
            continue
        if not rule.get("from") or any(admits(source, peer) for source in rule["from"]):
            return True
    return False


def pod_labels(group: dict[str, Any]) -> dict[str, str]:
    return dict(group["template"].get("metadata", {}).get("labels", {}))


def test_the_network_policy_covers_every_ray_pod(network_policy: dict[str, Any], manifest: dict[str, Any]) -> None:
    spec = network_policy["spec"]
    assert "Ingress" in spec["policyTypes"]
    for name, group in groups(manifest).items():
        assert selects(spec["podSelector"], pod_labels(group)), f"{name} pods are not under the network policy"
    assert spec["podSelector"].get("matchLabels"), "an empty podSelector would take in every pod of the namespace"


def test_other_pods_reach_only_the_serve_port(network_policy: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Ray's dashboard (its job API runs code), GCS and client ports are the cluster's own;
    modelpool's API on Serve's port checks keys and is the one way in."""
    serve_port = yaml.safe_load(manifest["spec"]["serveConfigV2"])["http_options"]["port"]
    named = {p["name"]: p["containerPort"] for p in ray_container(groups(manifest)["head"])["ports"]}
    ports = sorted({*named.values(), *OTHER_RAY_PORTS})
    strangers = [
        Peer({"app": "web"}),
        Peer({}, {"kubernetes.io/metadata.name": "elsewhere"}),
        Peer({"app.kubernetes.io/name": "kuberay-operator"}),  # in the namespace, but not the operator's
    ]
    for stranger in strangers:
        assert [p for p in ports if reaches(network_policy, stranger, p)] == [serve_port], stranger
    for name, group in groups(manifest).items():  # Ray's pods talk to one another on any port
        assert all(reaches(network_policy, Peer(pod_labels(group)), p) for p in ports), name
    operator = Peer({"app.kubernetes.io/name": "kuberay-operator"}, {"kubernetes.io/metadata.name": "ray-system"})
    assert [p for p in ports if reaches(network_policy, operator, p)] == sorted({named["dashboard"], serve_port})
