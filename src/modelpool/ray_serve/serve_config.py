"""The deployment `modelpool serve --ray` makes, as Ray Serve's declarative config (KubeRay
`RayService.spec.serveConfigV2`): the same applications and options, so the manifest in
`deploy/kuberay/` and the locally tested deployment are one thing. No Ray import."""

from __future__ import annotations

from typing import Any

from modelpool.config.schema import Config
from modelpool.ray_serve import naming
from modelpool.ray_serve.options import deployment_options, ingress_options

PROXY_HOST = "0.0.0.0"
"""Where Serve's proxies listen in the pods: every address (Kubernetes' Services reach them
there), so the config must have API keys, as `modelpool serve` on a non-loopback address."""


def serve_config_v2(config: Config, config_path: str) -> dict[str, Any]:
    """Ray Serve's declarative config (KubeRay `RayService.spec.serveConfigV2`) for the same
    applications `deploy()` runs, each built on the cluster from the config file at
    `config_path` (a path inside the pods)."""
    applications: list[dict[str, Any]] = []
    for app, models in naming.served_apps(config).items():
        options = deployment_options(models, config)
        applications.append(
            {
                "name": app,
                "import_path": "modelpool.ray_serve.apps:build_model",
                "route_prefix": None,
                "args": {"config": config_path, "app": app},
                "deployments": [{"name": "ModelReplica", **_yaml_safe(options), "user_config": {"overrides": {}}}],
            }
        )
    applications.append(
        {
            "name": naming.INGRESS_APP,
            "import_path": "modelpool.ray_serve.apps:build_ingress",
            "route_prefix": "/",
            "args": {"config": config_path},
            "deployments": [{"name": "Ingress", **_yaml_safe(ingress_options(config))}],
        }
    )
    return {
        "proxy_location": config.ray.proxy_location,
        "http_options": {"host": PROXY_HOST, "port": config.server.port},
        "applications": applications,
    }


def _yaml_safe(options: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in options.items() if value is not None}
