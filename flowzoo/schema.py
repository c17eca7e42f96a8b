"""Typed config sections: dataclasses built from plain mappings (YAML) with strict checking.

Unknown keys, wrong types, values outside a ``Literal`` and non-finite floats (NaN, inf) fail with a
:class:`ConfigError` naming the key, the bad value and the valid choices. Integers are accepted where floats are
expected; nothing else is coerced.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, TypeVar, Union

from flowzoo.errors import ConfigError

_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

T = TypeVar("T")

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: bad value {value!r}; valid: {', '.join(map(str, typing.get_args(tp)))}")
        return value
    if origin in (Union, types.UnionType):
        if isinstance(value, float) and not math.isfinite(value) and float in typing.get_args(tp):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        errors = []
        for option in typing.get_args(tp):
            try:
                return _check(value, option, where)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{where}: bad value {value!r}; expected {_describe(tp)}")
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"{where}: expected null, got {value!r}")
        return None
    if tp is float:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; it is meant as a number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        if not math.isfinite(number):  # NaN would pass every range check (`x < 0` is False for NaN)
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        if abs(number) > FLOAT32_MAX:  # tensors are float32: a larger value overflows inside torch
            raise ConfigError(f"{where}: {value!r} is beyond the float32 range (+-{FLOAT32_MAX:.4g})")
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:  # torch and numpy take 64-bit integers
            raise ConfigError(f"{where}: {value} does not fit in a 64-bit integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_check(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where)
    raise TypeError(f"unsupported config type {tp!r} at {where}")


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``; unspecified fields keep their defaults."""
    if data is None:
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            listed = ", ".join(known) or "(none: it takes no keys)"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; known: {listed}")
        kwargs[key] = _check(value, hints[key], f"{where}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}: {e}") from None


def _reject_nonfinite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _reject_nonfinite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _reject_nonfinite(item, f"{where}[{i}]")


def check_arguments(where: str, target: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Check keyword arguments for callable ``target`` (a class: its constructor) against its annotations, as config
    fields are checked: a value of the wrong type fails with a :class:`ConfigError` naming ``where.key``; so does a
    NaN or inf anywhere in a value. Annotations outside the config types (callables, path-likes, ...) and
    annotations that cannot be resolved are not checked. Returns the values text stood for, as config fields take
    them: ``{key: number}`` for each number written as text (YAML 1.1 reads ``1e9`` as a string); the caller puts
    them in place of the text, else the constructor would get the string."""
    read_as: dict[str, Any] = {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}: expected a mapping of argument names to values, got {kwargs!r}")
    try:
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # an annotation naming something not importable here
        hints = {}
    for key, value in kwargs.items():
        _reject_nonfinite(value, f"{where}.{key}")
        if key in hints:
            try:
                checked = _check(value, hints[key], f"{where}.{key}")
            except TypeError:  # an annotation outside the config types
                continue
            if isinstance(value, str) and not isinstance(checked, str):
                read_as[key] = checked
    return read_as


def to_mapping(obj: Any) -> Any:
    """Plain dicts/lists of a (nested) dataclass, for writing YAML."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_mapping(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    return obj


def differing_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two nested mappings differ (a key missing on one side differs from any value but None)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for key in sorted(set(a) | set(b), key=str)
                for d in differing_keys(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [] if a == b else [prefix.rstrip(".")]
