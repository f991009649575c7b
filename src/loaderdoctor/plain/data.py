"""Dataclasses rebuilt from their plain data (what dataclasses.asdict or their to_dict gives, after a JSON round
trip), guided by their fields' type hints, so that a dataclass gains a from_dict without a line per field; data
that is not what a hint says is refused with its path (PlainDataError), whatever class it was meant for."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from loaderdoctor.errors import LoaderDoctorError

T = TypeVar("T")
Path = tuple[str | int, ...]


class PlainDataError(ValueError):
    """Plain data that cannot be rebuilt: what is wrong, and where (`path`: the keys and list indices from the
    document's top, as path_words() writes them)."""

    def __init__(self, problem: str, path: Path = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path

    def __str__(self) -> str:
        return f"{path_words(self.path)}: {self.problem}" if self.path else self.problem


def path_words(path: Path) -> str:
    """A path as errors name it: loaders.train.recording.batches[3].wait_s (a key that is no identifier in
    brackets: loaders['my loader']; a key of over 64 characters cut)."""
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
            continue
        shown = key if len(key) <= 64 else f"{key[:48]}…"
        if key.isidentifier():
            text += f".{shown}" if text else shown
        else:
            text += f"[{shown!r}]"
    return text


def rebuilt_at(path: Path, build: Callable[..., T], *args: Any) -> T:
    """build(*args), any error it raises a PlainDataError under `path` (a missing key named as the path to it)."""
    try:
        return build(*args)
    except Exception as error:
        raise _under(path, error) from None


def _under(path: Path, error: Exception) -> PlainDataError:
    """`error`, raised while rebuilding the value at `path`, as a PlainDataError there."""
    if isinstance(error, PlainDataError):
        return PlainDataError(error.problem, (*path, *error.path))
    if isinstance(error, KeyError):
        key = error.args[0] if error.args else None
        if isinstance(key, str | int) and not isinstance(key, bool):
            return PlainDataError("missing", (*path, key))
        return PlainDataError(f"the key {key!r} is missing", path)
    if isinstance(error, LoaderDoctorError):
        return PlainDataError(error.message, path)
    return PlainDataError(str(error) or type(error).__name__, path)  # whatever a class's own checks raise


def field_of(data: Any, key: str, hint: Any) -> Any:
    """The value at `key` of the object `data`, rebuilt as `hint` says, for a from_dict that reads a field itself;
    a PlainDataError when `data` is no object or has no `key`."""
    if not isinstance(data, dict):
        raise PlainDataError(f"expected an object, got {_value_words(data)}")
    if key not in data:
        raise PlainDataError("missing", (key,))
    return rebuilt_at((key,), _converter(hint), data[key])


def dataclass_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """The `cls` instance whose dataclasses.asdict() is `data`: nested dataclasses, lists, tuples, dicts and
    optional values rebuilt as its fields' type hints say. A field missing from `data` takes its default; a key
    that is no field, a required field missing, or a value of another type raises PlainDataError."""
    return _built(cls, data, {}, {}, refuse_unknown=True)


def dataclass_from_written(
    cls: type[T], data: dict[str, Any], renamed: dict[str, str] | None = None, **given: Any
) -> T:
    """The `cls` instance whose to_dict() wrote `data`: keys renamed to their fields as `renamed` says (written
    key -> field), keys that name no field left out (figures to_dict derives from the fields, recomputed by the
    instance), the other fields rebuilt as dataclass_from_dict does, and the fields in `given` taken as they are.
    A field missing from both takes its default; a required one missing raises PlainDataError."""
    return _built(cls, data, renamed or {}, given, refuse_unknown=False)


def _built(cls: type[T], data: Any, renamed: dict[str, str], given: dict[str, Any], refuse_unknown: bool) -> T:
    if not isinstance(data, dict):
        raise PlainDataError(f"expected an object, got {_value_words(data)}")
    converters = _field_converters(cls)
    fields: dict[str, Any] = {}
    for key, value in data.items():
        name = renamed.get(key, key)
        if name in given:
            continue
        if name in converters:
            try:
                fields[name] = converters[name](value)
            except Exception as error:
                raise _under((key,), error) from None
        elif refuse_unknown:
            raise PlainDataError(f"{cls.__name__} has no field {key!r}")
    written = {name: key for key, name in renamed.items()}
    for name in _required(cls):
        if name not in fields and name not in given:
            raise PlainDataError("missing", (written.get(name, name),))
    return cls(**fields, **given)


@functools.cache
def _field_converters(cls: type) -> dict[str, Callable[[Any], Any]]:
    """For each field `cls.__init__` takes, what rebuilds it from plain data by its resolved type hint
    (`from __future__ import annotations` leaves hints as strings until get_type_hints resolves them)."""
    hints = typing.get_type_hints(cls)
    return {field.name: _converter(hints[field.name]) for field in dataclasses.fields(cls) if field.init}


@functools.cache
def _required(cls: type) -> tuple[str, ...]:
    """The fields `cls.__init__` cannot do without."""
    missing = dataclasses.MISSING
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.init and f.default is missing and f.default_factory is missing
    )


@functools.cache
def _takes_name(cls: type) -> bool:
    """Whether cls.from_dict(name, data) rebuilds an item of a dict by its key (a loader's report, by its name)."""
    return len(inspect.signature(cls.from_dict).parameters) == 2


# What each plain type accepts (a whole number is a number too; true and false are no numbers).
_PLAIN: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
_PLAIN_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


@functools.cache
def _converter(hint: Any) -> Callable[[Any], Any]:
    """What rebuilds a value of type `hint` from plain data, raising PlainDataError (with the path within the
    value) where it is not of that type. Made once per hint: a recording holds thousands of values."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or (origin is dict and args and args[1] is Any):
        return _any if hint is Any else _checked(hint, dict)
    if origin in (typing.Union, types.UnionType):
        return _union(hint, args)
    if hint in _PLAIN:
        return _plain(hint)
    if origin is list or hint is list:
        return _items(hint, list, _converter(args[0]) if args else _any)
    if origin is tuple:
        return _tuple(hint, args)
    if origin is dict or hint is dict:
        return _dict(hint, args[1] if args else Any)
    if isinstance(hint, type) and (hasattr(hint, "from_dict") or dataclasses.is_dataclass(hint)):
        build = hint.from_dict if hasattr(hint, "from_dict") else functools.partial(dataclass_from_dict, hint)
        an_object = _checked(hint, dict)
        return lambda value: build(an_object(value))
    return _any  # a hint plain data cannot be checked against: taken as it is


def _any(value: Any) -> Any:
    return value


def _checked(hint: Any, kinds: type | tuple[type, ...]) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if not isinstance(value, kinds):
            raise _wrong(hint, value)
        return value

    return checked


def _plain(hint: type) -> Callable[[Any], Any]:
    kinds = _PLAIN[hint]

    def plain(value: Any) -> Any:
        if not isinstance(value, kinds) or (isinstance(value, bool) and hint is not bool):
            raise _wrong(hint, value)
        return value

    return plain


def _union(hint: Any, args: tuple[Any, ...]) -> Callable[[Any], Any]:
    choices = [arg for arg in args if arg is not type(None)]
    optional = len(choices) < len(args)
    if len(choices) == 1:  # one type besides None (`X | None`)
        one = _converter(choices[0])
        return lambda value: None if value is None and optional else one(value)
    if any(choice not in _PLAIN for choice in choices):  # a union of classes: taken as it is
        return _any
    plain = [_plain(choice) for choice in choices]  # a union of plain types (`int | float`)

    def union(value: Any) -> Any:
        if value is None and optional:
            return None
        for choice in plain:
            with contextlib.suppress(PlainDataError):
                return choice(value)
        raise _wrong(hint, value)

    return union


def _items(hint: Any, kind: Any, item: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    def items(value: Any) -> list[Any]:
        if not isinstance(value, kind):
            raise _wrong(hint, value)
        rebuilt = []
        for index, each in enumerate(value):
            try:
                rebuilt.append(item(each))
            except Exception as error:
                raise _under((index,), error) from None
        return rebuilt

    return items


def _tuple(hint: Any, args: tuple[Any, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(args) == 2 and args[1] is Ellipsis:
        items = _items(hint, list | tuple, _converter(args[0]))
        return lambda value: tuple(items(value))
    converters = [_converter(arg) for arg in args]

    def fixed(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise _wrong(hint, value)
        if not converters:
            return tuple(value)
        if len(converters) != len(value):
            raise PlainDataError(f"expected a list of {len(converters)}, got a list of {len(value)}")
        pairs = enumerate(zip(converters, value, strict=True))
        return tuple(rebuilt_at((i,), convert, each) for i, (convert, each) in pairs)

    return fixed


def _dict(hint: Any, item: Any) -> Callable[[Any], dict[str, Any]]:
    named = isinstance(item, type) and hasattr(item, "from_dict") and _takes_name(item)
    convert, an_object = _converter(item), _checked(item, dict)

    def rebuilt(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _wrong(hint, value)
        if named:  # a loader's report, rebuilt with its name
            return {key: rebuilt_at((key,), item.from_dict, key, an_object(each)) for key, each in value.items()}
        return {key: rebuilt_at((key,), convert, each) for key, each in value.items()}

    return rebuilt


def _wrong(hint: Any, value: Any) -> PlainDataError:
    return PlainDataError(f"expected {_hint_words(hint)}, got {_value_words(value)}")


def _hint_words(hint: Any) -> str:
    """What a type hint asks for, in words: "a number or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        words = [_hint_words(arg) for arg in args if arg is not type(None)]
        return " or ".join([*words, "null"] if type(None) in args else words)
    if hint in _PLAIN_WORDS:
        return _PLAIN_WORDS[hint]
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list"
    return "an object"


def _value_words(value: Any) -> str:
    """What a JSON value is, in words: "a string", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__
