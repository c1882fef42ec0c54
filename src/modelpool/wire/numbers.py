"""Whole floats as integers: which fields of a wire model hold integers, and a value with
its whole floats turned into ints (`WireModel` applies it before strict validation)."""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

_EXACT = 2**53
"""Past this magnitude a float no longer spells one integer."""


@functools.cache
def integer_fields(model: type[BaseModel]) -> frozenset[str]:
    """The input names (alias or name) of the fields whose type holds integers and no
    floats, alone or in lists (`int | None`, `list[int]`, `str | list[list[int]]`)."""
    names = set()
    for name, field in model.model_fields.items():
        leaves = _leaves(field.annotation)
        if int in leaves and not leaves & {float, Any, object}:
            names.add(field.alias or name)
    return frozenset(names)


def as_integers(value: Any) -> Any:
    """`value` with each whole float (in lists too) as its int; anything else as it was."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    if isinstance(value, list):
        return [as_integers(item) for item in value]
    return value


def _leaves(annotation: Any) -> set[Any]:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaves(get_args(annotation)[0])
    if origin is Literal:
        return {type(arg) for arg in get_args(annotation)}
    if origin in (Union, types.UnionType, list, tuple):
        return set().union(*(_leaves(arg) for arg in get_args(annotation) if arg is not Ellipsis))
    if origin is not None:  # a dict, a set: integers inside a mapping are not this module's business
        return {object}
    return {annotation}
