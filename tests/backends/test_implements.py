"""`implements` (the request path's protocol check, answered once per class) says exactly
what `isinstance` says, for every backend modelpool ships and every backend protocol."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from modelpool.backends import base
from modelpool.backends.registry import BACKENDS
from tests.fakes import EchoBackend, FakeBackend, FakeProcessBackend

PROTOCOLS = [value for value in vars(base).values()
             if isinstance(value, type) and getattr(value, "_is_runtime_protocol", False)]  # fmt: skip


def _shipped_classes() -> list[type[Any]]:
    classes: list[type[Any]] = []
    for path in BACKENDS.values():
        module, _, name = path.partition(":")
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except ImportError:  # an engine whose extra is not installed here
            continue
    return classes


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_implements_agrees_with_isinstance(protocol: type[Any]) -> None:
    classes = [*_shipped_classes(), EchoBackend, FakeBackend, FakeProcessBackend, object]
    assert len(classes) > 10
    for cls in classes:
        instance: object = object.__new__(cls)
        assert base.implements(instance, protocol) == isinstance(instance, protocol), (cls, protocol)
        assert base.implements(instance, protocol) == isinstance(instance, protocol)  # the cached answer too


def test_a_protocol_with_data_members_is_asked_of_the_instance() -> None:
    """`ProcessBackend.pid` is a property: whether an object has it can depend on the instance."""

    class Partial(FakeProcessBackend):
        pass

    instance = object.__new__(Partial)
    assert base.implements(instance, base.ProcessBackend) == isinstance(instance, base.ProcessBackend)
