"""compose.yaml cannot be brought up here (no compose tool, no registry for Prometheus and
Grafana): these checks keep it in step with the Dockerfile, the Makefile, the server's
settings and the provisioning files under deploy/compose/ instead."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelpool.api.routes import health as health_routes
from modelpool.config.schema import ServerConfig
from tests.containers.host import REPO, make_image_tag

COMPOSE = REPO / "compose.yaml"
DOCKERFILE = (REPO / "Dockerfile").read_text("utf-8")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text("utf-8"))
    assert isinstance(data, dict)
    return data


def service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(compose["services"][name])


def bind_mounts(spec: dict[str, Any]) -> dict[str, Path]:
    """Container path → host path of each `./...` bind mount."""
    mounts = {}
    for volume in spec.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def published_port(spec: dict[str, Any]) -> int:
    (mapping,) = spec["ports"]
    return int(mapping.rsplit(":", 1)[1])


def test_modelpool_builds_the_default_image(compose: dict[str, Any]) -> None:
    modelpool = service(compose, "modelpool")
    assert "profiles" not in modelpool, "modelpool must come up without a profile"
    build = modelpool["build"]
    assert (REPO / build["context"] / "Dockerfile").is_file()
    assert re.search(rf"^FROM \S+ AS {build['target']}$", DOCKERFILE, re.MULTILINE)
    assert modelpool["image"] == make_image_tag("image")


def test_modelpool_mounts_the_config_and_keeps_models(compose: dict[str, Any]) -> None:
    modelpool = service(compose, "modelpool")
    assert bind_mounts(modelpool) == {"/config": REPO / "config"}
    assert "models:/models" in modelpool["volumes"] and "models" in compose["volumes"]
    assert 'VOLUME ["/config", "/models"]' in DOCKERFILE


def test_modelpool_port_health_and_stop_match_the_image(compose: dict[str, Any]) -> None:
    modelpool = service(compose, "modelpool")
    port = published_port(modelpool)
    assert modelpool["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert modelpool["environment"]["MODELPOOL_SERVER__PORT"] == str(port)
    check = re.search(r"^HEALTHCHECK .*?CMD (\[.*?\])$", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert check and ["CMD", *yaml.safe_load(check.group(1))] == modelpool["healthcheck"]["test"]
    grace = float(modelpool["stop_grace_period"].removesuffix("s"))
    assert grace > ServerConfig().shutdown_grace_s, "the runtime would kill in-flight requests"


def test_prometheus_scrapes_modelpool(compose: dict[str, Any]) -> None:
    prometheus = service(compose, "prometheus")
    assert prometheus["profiles"] == ["monitoring"]
    config_file = bind_mounts(prometheus)["/etc/prometheus/prometheus.yml"]
    (job,) = yaml.safe_load(config_file.read_text("utf-8"))["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    port = published_port(service(compose, "modelpool"))
    assert job["static_configs"] == [{"targets": [f"modelpool:{port}"]}]
    # The path Prometheus scrapes is one the server serves (its route, not a grep of its source).
    served = {(getattr(route, "path", None), method) for route in health_routes.router.routes
              for method in getattr(route, "methods", ())}  # fmt: skip
    assert (job["metrics_path"], "GET") in served


def test_grafana_is_provisioned_with_the_dashboard(compose: dict[str, Any]) -> None:
    grafana = service(compose, "grafana")
    assert grafana["profiles"] == ["monitoring"]
    mounts = bind_mounts(grafana)
    dashboards = [target for target, source in mounts.items() if source == REPO / "docs/grafana-dashboard.json"]
    assert len(dashboards) == 1
    provider_file = mounts["/etc/grafana/provisioning/dashboards/modelpool.yml"]
    (provider,) = yaml.safe_load(provider_file.read_text("utf-8"))["providers"]
    assert provider["options"]["path"] == str(Path(dashboards[0]).parent)
    (datasource,) = yaml.safe_load(mounts["/etc/grafana/provisioning/datasources/modelpool.yml"].read_text("utf-8"))[
        "datasources"
    ]
    prometheus_port = published_port(service(compose, "prometheus"))
    assert (datasource["type"], datasource["url"]) == ("prometheus", f"http://prometheus:{prometheus_port}")
    assert datasource["isDefault"] is True  # what the dashboard's DS_PROMETHEUS variable picks


def test_every_bind_mount_exists(compose: dict[str, Any]) -> None:
    for name, spec in compose["services"].items():
        for target, source in bind_mounts(spec).items():
            if target == "/config":
                continue  # the user's own config folder: optional (the image serves its starters)
            assert source.is_file(), f"{name}: {source} (mounted at {target}) does not exist"


def test_the_gpu_example_reserves_nvidia_devices() -> None:
    text = COMPOSE.read_text("utf-8")
    example = "\n".join(line.replace("#", "", 1) for line in text.splitlines() if line.lstrip().startswith("# "))
    assert "driver: nvidia" in example and "capabilities: [gpu]" in example
