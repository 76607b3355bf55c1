"""Nested configuration dataclasses: dotted access, typed overrides, JSON round trips, CLI flags.

One way to configure everything: a configuration is a tree of frozen dataclasses (a section is a
field whose type is itself a dataclass), each field documented by the string literal under it
(as CleanRL and tyro do). This module is the single place that knows how to

* list the leaves of a tree as dotted names (:func:`leaves`: ``reward.lambda_token``, ...);
* apply overrides by dotted name, parsing strings into the field's type (:func:`apply`), so that
  ``--set reward.lambda_token=0.4`` is an ``float`` and ``--set sft.lora=false`` a ``bool``;
  every section's ``__post_init__`` validates the result, so a bad value fails when the config is
  built, not after an hour of generation;
* write a tree to a JSON-ready dict and read it back (:func:`to_dict`, :func:`from_dict`), with
  unknown keys refused and the close matches suggested;
* describe the fields for ``--help`` (:func:`describe`).

Both command lines (``python -m optima_trainers.train`` and ``python -m benchmarks.run``) use it.
It is our own code (about 200 lines) because the libraries made for this (tyro, simple-parsing)
would add a dependency to the core for what is a small, stable piece, and they parse the whole
command line, where our CLIs keep a few hand-picked flags beside ``--set``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import math
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from optima_env.errors import ConfigError

__all__ = [
    "ConfigError",
    "apply",
    "check_number",
    "check_positive_int",
    "describe",
    "field_docs",
    "from_dict",
    "get",
    "leaves",
    "parse_sets",
    "parse_value",
    "to_dict",
]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass (its documentation), by field name."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                out[node.target.id] = " ".join(nxt.value.value.split())
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _section_type(type_: Any) -> type | None:
    """The dataclass type of a section field (``X`` or ``X | None``), else ``None``."""
    if dataclasses.is_dataclass(type_) and isinstance(type_, type):
        return type_
    return None


def leaves(cls: type, prefix: str = "") -> dict[str, tuple[Any, dataclasses.Field[Any]]]:
    """Every leaf field of a config tree by dotted name: ``{"reward.lambda_token": (type, field)}``."""
    out: dict[str, tuple[Any, dataclasses.Field[Any]]] = {}
    hints = _hints(cls)
    for name, f in _fields(cls).items():
        section = _section_type(hints[name])
        if section is not None:
            out.update(leaves(section, f"{prefix}{name}."))
        else:
            out[prefix + name] = (hints[name], f)
    return out


def _type_name(type_: Any) -> str:
    if typing.get_origin(type_) is Literal:
        return "|".join(repr(a) for a in typing.get_args(type_))
    if isinstance(type_, type):
        return type_.__name__
    return str(type_).replace("typing.", "")


def _fail(name: str, expected: str, got: Any, fix: str = "") -> ConfigError:
    return ConfigError(
        f"config field {name!r}: expected {expected}, got {got!r}" + (f"; {fix}" if fix else "")
    )


_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}


# size: one dispatch over the supported field types (bool, int, float, str, Literal, Optional, tuple, mapping)
def parse_value(name: str, type_: Any, value: Any, *, strict: bool = False) -> Any:
    """``value`` converted to the field type ``type_``; strings (from a command line) are parsed,
    unless ``strict`` (values read from JSON must already have their type).

    >>> parse_value("x", float, "0.4"), parse_value("y", bool, "false"), parse_value("z", int | None, "none")
    (0.4, False, None)
    """
    origin, args = typing.get_origin(type_), typing.get_args(type_)
    if type_ is Any:
        return json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value
    if origin in (typing.Union, types.UnionType):
        if value is None or (
            not strict and isinstance(value, str) and value.strip().lower() in ("none", "null")
        ):
            if type(None) in args:
                return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return parse_value(name, option, value, strict=strict)
            except ConfigError as exc:
                errors.append(str(exc))
        options = [_type_name(a) for a in args if a is not type(None)] + (
            ["none"] if type(None) in args else []
        )
        raise _fail(name, " or ".join(options), value)
    if origin is Literal:
        if value in args:
            return value
        raise _fail(name, "one of " + ", ".join(repr(a) for a in args), value)
    if type_ is bool:
        if isinstance(value, bool):
            return value
        if not strict and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _fail(name, "a bool (true or false)", value)
    if type_ in (int, float):
        if isinstance(value, str) and not strict:
            try:
                value = json.loads(value.strip())
            except json.JSONDecodeError:
                raise _fail(name, f"a number ({type_.__name__})", value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(name, f"a number ({type_.__name__})", value)
        if type_ is int:
            if isinstance(value, float) and not value.is_integer():
                raise _fail(name, "an int", value)
            return int(value)
        return float(value)
    if type_ is str:
        if isinstance(value, str):
            return value
        raise _fail(name, "a string", value)
    if origin is tuple or type_ is tuple:
        if isinstance(value, str) and not strict:
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else [v for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise _fail(name, "a list (JSON or comma-separated)", value)
        if args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _fail(name, f"{len(args)} values", value)
            return tuple(
                parse_value(f"{name}[{i}]", a, v, strict=strict) for i, (a, v) in enumerate(zip(args, value))
            )
        item = args[0] if args else Any
        return tuple(parse_value(f"{name}[{i}]", item, v, strict=strict) for i, v in enumerate(value))
    if origin in (dict, Mapping) or type_ in (dict, Mapping) or origin is typing.Mapping:
        if isinstance(value, str) and not strict:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _fail(name, "a JSON object", value) from None
        if not isinstance(value, Mapping):
            raise _fail(name, "a mapping (a JSON object)", value)
        return dict(value)
    return value


def _unknown(name: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
    return ConfigError(f"unknown config field {name!r}; {hint}")


def apply(config: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of ``config`` with ``overrides`` (dotted names to values) applied, sections rebuilt
    (so their ``__post_init__`` validates). ``None`` values are applied as ``None``."""
    return _apply(config, overrides, "")


def _apply(config: Any, overrides: Mapping[str, Any], prefix: str) -> Any:
    cls, hints, fields = type(config), _hints(type(config)), _fields(type(config))
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in overrides.items():
        head, _, rest = dotted.partition(".")
        if head not in fields:
            raise _unknown(prefix + dotted, list(leaves(cls, prefix)))
        section = _section_type(hints[head])
        if rest:
            if section is None:
                raise ConfigError(
                    f"config field {prefix + head!r} is not a section; set it as {prefix + head}=VALUE"
                )
            nested.setdefault(head, {})[rest] = value
        elif section is not None:
            raise ConfigError(
                f"config field {prefix + head!r} is a section; set its fields ({prefix + head}.FIELD=VALUE)"
            )
        else:
            direct[head] = parse_value(prefix + head, hints[head], value)
    for head, sub in nested.items():
        direct[head] = _apply(getattr(config, head), sub, f"{prefix}{head}.")
    if not direct:
        return config
    try:
        return dataclasses.replace(config, **direct)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # the section's own validation (any OptimaError is a ValueError)
        raise ConfigError(f"config section {prefix.rstrip('.') or cls.__name__!r}: {exc}") from exc


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready nested dict (tuples become lists)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return plain(config)


def from_dict(cls: type, data: Mapping[str, Any], *, prefix: str = "", strict: bool = True) -> Any:
    """Rebuild a tree written by :func:`to_dict`; unknown keys and bad values raise :class:`ConfigError`."""
    if not isinstance(data, Mapping):
        raise _fail(prefix.rstrip(".") or cls.__name__, "a JSON object", data)
    hints, fields = _hints(cls), _fields(cls)
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in fields:
            raise _unknown(prefix + name, [prefix + n for n in fields])
        section = _section_type(hints[name])
        if section is not None:
            values[name] = from_dict(section, value, prefix=f"{prefix}{name}.", strict=strict)
        else:
            values[name] = parse_value(prefix + name, hints[name], value, strict=strict)
    missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # fmt: skip
    if missing:
        raise ConfigError(f"config field {prefix + missing[0]!r}: missing (a required field)")
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config section {prefix.rstrip('.') or cls.__name__!r}: {exc}") from exc


def describe(cls: type, config: Any | None = None, *, prefix: str = "") -> list[str]:
    """One line per leaf: ``name (type, default or current value): documentation``."""
    lines = []
    for name, (type_, f) in leaves(cls, prefix).items():
        if config is not None:
            current: Any = config
            for part in name[len(prefix) :].split("."):
                current = getattr(current, part)
        elif f.default is not dataclasses.MISSING:
            current = f.default
        else:
            current = "required" if f.default_factory is dataclasses.MISSING else f.default_factory()
        owner = cls
        for part in name[len(prefix) :].split(".")[:-1]:
            owner = _section_type(_hints(owner)[part]) or owner
        doc = field_docs(owner).get(name.rsplit(".", 1)[-1], "")
        lines.append(f"{name} ({_type_name(type_)}, {current!r}): {doc}")
    return lines


def parse_sets(items: Any) -> dict[str, str]:
    """``["a.b=1", "c=x"]`` (repeated ``--set NAME=VALUE`` flags) as ``{"a.b": "1", "c": "x"}``;
    the values are parsed later, into each field's type, by :func:`apply`."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects NAME=VALUE (e.g. reward.lambda_token=0.4), got {item!r}")
        out[key.strip()] = raw.strip()
    return out


def get(config: Any, dotted: str) -> Any:
    """The value of one dotted field (``get(config, "reward.lambda_token")``)."""
    value = config
    for part in dotted.split("."):
        if isinstance(value, Mapping):
            value = value[part]
        else:
            value = getattr(value, part)
    return value


def check_positive_int(name: str, value: Any) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int >= 1 (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")


def check_number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False
) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite number within the bounds."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = f" in {'(' if low_open else '['}{low}, {high}]" if high is not None else ""
        bounds = bounds or (f" {'>' if low_open else '>='} {low}" if low is not None else "")
        raise ConfigError(f"{name} must be a finite number{bounds}, got {value!r}")
