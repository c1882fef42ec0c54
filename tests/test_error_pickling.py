"""Errors cross process boundaries (engine workers, and Ray replicas next): each one must
come back from pickle with the status, envelope fields and headers the API renders."""

from __future__ import annotations

import pickle

import pytest

from modelpool import errors
from modelpool.errors import ModelpoolError


def every_error_class(root: type[ModelpoolError] = ModelpoolError) -> list[type[ModelpoolError]]:
    found = [root]
    for sub in root.__subclasses__():
        found += every_error_class(sub)
    return found


SPECIAL: dict[str, ModelpoolError] = {
    "ModelNotFound": errors.ModelNotFound("nope", ["a", "b"]),
    "RateLimited": errors.RateLimited("slow down", limit="tokens", retry_after_s=1.25),
    "UpstreamError": errors.UpstreamError(503, "upstream broke", error_type="server_error", code="boom"),
    "ModelNotReady": errors.ModelNotReady("loading", retry_after_s=7),
    "LoadAbandoned": errors.LoadAbandoned("nobody waits for it any more", retry_after_s=3),
    "ExtraNotInstalled": errors.ExtraNotInstalled("The MCP server", "mcp"),
}


def example(cls: type[ModelpoolError]) -> ModelpoolError:
    if cls.__name__ in SPECIAL:
        return SPECIAL[cls.__name__]
    return cls("something went wrong", param="field")


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda cls: cls.__name__)
def test_every_error_survives_pickle(cls: type[ModelpoolError]) -> None:
    error = example(cls)
    assert type(error) is cls, "the example table names a class that is not this one"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    seen = (copy.message, str(copy), copy.status_code, copy.type, copy.code, copy.param, copy.headers)
    assert seen == (error.message, str(error), error.status_code, error.type, error.code, error.param, error.headers)
    assert vars(copy) == vars(error)
