"""Dataclasses rebuilt from their plain data (what dataclasses.asdict or their to_dict gives, after a JSON round
trip), guided by their fields' type hints, so that a dataclass gains a from_dict without a line per field."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def dataclass_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """The `cls` instance whose dataclasses.asdict() is `data`: nested dataclasses, lists, tuples, dicts and
    optional values rebuilt as its fields' type hints say. A field missing from `data` takes its default; a key
    that is no field raises TypeError, as calling `cls` with it would."""
    hints = _field_hints(cls)
    return cls(**{name: _from_plain(hints[name], value) if name in hints else value for name, value in data.items()})


def dataclass_from_written(
    cls: type[T], data: dict[str, Any], renamed: dict[str, str] | None = None, **given: Any
) -> T:
    """The `cls` instance whose to_dict() wrote `data`: keys renamed to their fields as `renamed` says (written
    key -> field), keys that name no field left out (figures to_dict derives from the fields, recomputed by the
    instance), the other fields rebuilt as dataclass_from_dict does, and the fields in `given` taken as they are.
    A field missing from both takes its default; a required one missing raises TypeError, as calling `cls` would."""
    hints = _field_hints(cls)
    renamed = renamed or {}
    rebuilt = hints.keys() - given.keys()
    written = {renamed.get(key, key): value for key, value in data.items()}
    fields = {name: _from_plain(hints[name], value) for name, value in written.items() if name in rebuilt}
    return cls(**{**fields, **given})


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of the fields `cls.__init__` takes (`from __future__ import annotations` leaves
    them as strings until get_type_hints resolves them)."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls) if field.init}


def _from_plain(hint: Any, value: Any) -> Any:
    """`value`, plain data, as the type `hint` describes it."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        choices = [arg for arg in args if arg is not type(None)]
        # One type besides None (`X | None`); a union of plain types (`int | float`) is already right as it is.
        return _from_plain(choices[0], value) if len(choices) == 1 else value
    if origin is list:
        return [_from_plain(args[0], item) for item in value] if args else list(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(args[0], item) for item in value)
        return tuple(_from_plain(arg, item) for arg, item in zip(args, value, strict=True)) if args else tuple(value)
    if origin is dict:
        return {key: _from_plain(args[1], item) for key, item in value.items()} if args else dict(value)
    if isinstance(hint, type) and hasattr(hint, "from_dict"):  # a class that knows its own dict (Settings)
        return hint.from_dict(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return dataclass_from_dict(hint, value)
    return value
