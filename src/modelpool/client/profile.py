"""The agent sample's newer profile shape, read into the flat entries models.yaml uses.

    {"models": {"agent_llm": {"category": "llm",
                              "adapter": {"preset": "nemotron3_nano"},
                              "endpoint": {"base_url": "http://localhost:8107", "readiness": "health"},
                              "deployment": {"ownership": "reused", "service": "agent-llm"}}}}

`adapter` holds the model and wire quirks (`preset` or `kind`, `model_name`,
`capabilities`, `reasoning_field`, `default_extras`), `endpoint` the connection
(`base_url`, `api_key_env`, `timeout`, `readiness: health|none`), `deployment` who runs the
server (`managed` or `reused` with a `service` name, or `external`) — the launcher's
business, checked here and otherwise not used by the client. Profiles may be YAML or JSON
(the YAML loader reads both), wrapped in `models` or not; flat entries may sit beside
nested ones. Unknown keys in any section are refused, as in a flat entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECTIONS = ("adapter", "endpoint", "deployment")
ADAPTER_KEYS = {"preset", "kind", "model_name", "capabilities", "reasoning_field", "default_extras"}
ENDPOINT_KEYS = {"base_url", "api_key_env", "timeout", "readiness"}
DEPLOYMENT_KEYS = {"ownership", "service", "credentials"}
OWNERSHIPS = {"managed", "reused", "external"}
READINESS = {"health": True, "none": False}


def flatten_profile(data: Any) -> Any:
    """`data` with a `models` wrapper removed and every nested entry made flat; anything
    else is returned as it is (the flat loader then says what is wrong with it)."""
    if isinstance(data, Mapping) and set(data) == {"models"} and isinstance(data["models"], Mapping):
        data = data["models"]
    if not isinstance(data, Mapping):
        return data
    return {role: flat_entry(str(role), entry) for role, entry in data.items()}


def flat_entry(role: str, entry: Any) -> Any:
    """One nested entry as a flat one (ValueError naming the role and section when wrong)."""
    if not isinstance(entry, Mapping) or not any(section in entry for section in SECTIONS):
        return entry
    unknown = set(entry) - {"category", *SECTIONS}
    if unknown:
        raise ValueError(f"role {role!r}: {', '.join(sorted(unknown))} must go in adapter, endpoint or deployment")
    adapter, endpoint, deployment = (_section(role, entry, name) for name in SECTIONS)
    _check_keys(role, "adapter", adapter, ADAPTER_KEYS)
    _check_keys(role, "endpoint", endpoint, ENDPOINT_KEYS)
    _check_keys(role, "deployment", deployment, DEPLOYMENT_KEYS)
    _check_deployment(role, deployment)
    flat: dict[str, Any] = {key: value for key, value in adapter.items() if key != "preset"}
    if "preset" in adapter:
        flat["kind"] = f"preset:{adapter['preset']}"
    flat.update({key: value for key, value in endpoint.items() if key != "readiness"})
    if "readiness" in endpoint:
        if endpoint["readiness"] not in READINESS:
            raise ValueError(f"role {role!r}: unsupported readiness {endpoint['readiness']!r} (health or none)")
        flat["health_check"] = READINESS[endpoint["readiness"]]
    if "category" in entry:
        flat["category"] = entry["category"]
    return flat


def _section(role: str, entry: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = entry.get(name, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"role {role!r}: {name} must be a mapping")
    return value


def _check_keys(role: str, name: str, section: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = set(section) - allowed
    if unknown:
        raise ValueError(f"role {role!r}: unknown {name} field(s) {', '.join(sorted(map(str, unknown)))}")


def _check_deployment(role: str, deployment: Mapping[str, Any]) -> None:
    ownership = deployment.get("ownership", "external")
    if ownership not in OWNERSHIPS:
        raise ValueError(f"role {role!r}: unsupported deployment ownership {ownership!r} (managed, reused, external)")
    if ownership in ("managed", "reused") and not deployment.get("service"):
        raise ValueError(f"role {role!r}: {ownership} deployments require a service name")
