"""Which `MODELPOOL_*` environment variables are config, and the config path each one sets.

A variable is read as config only when its name spells a real path of the `Config` schema:
`MODELPOOL_SERVER__PORT` is `server.port` (`__` between levels, any case). Below a mapping
field (`models`, a model's `options`, `ray.groups`) any key is accepted, since the schema
cannot list them. Everything else with the prefix is left alone (a debug line names it,
never its value), so a variable that only looks like config (`MODELPOOL_APP_KEY` holding a
key that `auth.keys[].key_env` names) cannot break start-up.

A model id has capitals, dashes and dots that a shell's variable names cannot hold, so a
segment under `models` is matched against the catalog's ids ignoring case, with `_`
standing for `-` or `.`: `MODELPOOL_MODELS__SMOLLM2_135M_INSTRUCT__PRELOAD` is
`models.smollm2-135m-instruct.preload` and `MODELPOOL_MODELS__WHISPER_TINY_EN__...` is
`whisper-tiny.en`. Two ids that match the same segment are an error naming both; a segment
no id matches names a new model (its id the segment in lower case).

The names the CLI, the SDK, the services and the tests read for themselves are reserved:
listed here, in one place, and never read as config.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

from pydantic import BaseModel

from modelpool.config.schema import Config
from modelpool.errors import ConfigError

ENV_PREFIX = "MODELPOOL_"

RESERVED_ENV_NAMES = frozenset({
    "MODELPOOL_CONFIG",  # the config file (the loader reads it as a path, not as config)
    "MODELPOOL_LOCAL_CONFIG",  # the local override file
    "MODELPOOL_URL",  # the server the CLI talks to (ps, status, load, unload, run)
    "MODELPOOL_API_KEY",  # the key the CLI sends to it
    "MODELPOOL_STATE_DIR",  # the registry of services; config.state_dir falls back to it
    "MODELPOOL_STACK",  # the stack file of `up`/`down`, inherited by a stack's services
    "MODELPOOL_CREDENTIALS",  # the saved-keys file (`modelpool credentials`), read by the SDK and `up`
    "MODELPOOL_UI_SCREENSHOTS",  # where the workbench tests save screenshots
    "MODELPOOL_CHROMIUM",  # the browser the workbench tests drive
})  # fmt: skip
"""Variables modelpool reads for itself. MODELPOOL_STATE_DIR is also the meaning of the
config key `state_dir`, which falls back to it when unset, so nothing is lost by not
reading it as config."""

RESERVED_ENV_PREFIXES = ("MODELPOOL_TEST_",)
"""Switches of the opt-in tests (MODELPOOL_TEST_VLLM=1) and the names tests make up."""

MODELS_FIELD = "models"


def is_reserved(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def config_path(name: str, model_ids: Iterable[str] = ()) -> list[str] | None:
    """The config path a variable sets, or None when it is not config (reserved, or no such
    path in the schema). `model_ids` are the catalog's ids, for the `models` segment."""
    if not name.startswith(ENV_PREFIX) or is_reserved(name) or not _is_config(name):
        return None
    segments = _segments(name)
    path = [s.lower() for s in segments]
    if path[0] == MODELS_FIELD and len(path) > 1:
        path[1] = model_id_for(segments[1], model_ids)
    return path


def model_id_for(segment: str, model_ids: Iterable[str]) -> str:
    """The catalog id a variable's segment names (case and `-`/`.`/`_` ignored), else the
    segment itself in lower case (a model the environment adds)."""
    wanted = _folded(segment)
    matches = sorted({model_id for model_id in model_ids if _folded(model_id) == wanted})
    if len(matches) > 1:
        raise ConfigError(
            f"environment variable segment {segment!r} matches several model ids ({', '.join(matches)}); "
            "set the model in a config file instead"
        )
    return matches[0] if matches else segment.lower()


def unread_names(environ: Mapping[str, str]) -> list[str]:
    """`MODELPOOL_*` variables that are neither reserved nor config: ignored (names only)."""
    return sorted(
        name for name in environ if name.startswith(ENV_PREFIX) and not is_reserved(name) and not _is_config(name)
    )


def _is_config(name: str) -> bool:
    segments = [part.lower() for part in _segments(name)]
    return bool(segments) and _in_schema(Config, segments)


def _segments(name: str) -> list[str]:
    return [part for part in name[len(ENV_PREFIX) :].split("__") if part]


def _folded(text: str) -> str:
    return text.lower().replace("-", "_").replace(".", "_")


def _in_schema(annotation: Any, path: Sequence[str]) -> bool:
    """Whether `path` leads somewhere inside a value of type `annotation`."""
    if not path or annotation is Any:
        return True
    for arm in _arms(annotation):
        if isinstance(arm, type) and issubclass(arm, BaseModel):
            field = arm.model_fields.get(path[0])
            if field is not None and _in_schema(field.annotation, path[1:]):
                return True
        elif typing.get_origin(arm) in (dict, Mapping):
            value_type = typing.get_args(arm)[1] if typing.get_args(arm) else Any
            if _in_schema(value_type, path[1:]):
                return True
    return False


def _arms(annotation: Any) -> tuple[Any, ...]:
    """The types a field may hold: each arm of a union (`X | None`), else the type itself."""
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(annotation)
    if origin is typing.Annotated:
        return _arms(typing.get_args(annotation)[0])
    return (annotation,)
