"""One style for every command line: flags generated from configuration dataclasses, shared exit
codes, ``--debug`` and logging.

Every command (``optima-train`` / ``python -m optima_trainers.train``, ``optima-export``,
``optima-bench`` / ``python -m benchmarks.run``, ``optima-rollout-bench``) builds its parser with
:class:`Parser` and runs its body through :func:`run_command`:

* **Flags from fields.** :func:`add_field_flags` turns each field of a frozen dataclass into
  ``--kebab-name`` (or, for a configuration tree, a :class:`Flag` alias such as ``--lambda-token``
  for ``reward.lambda_token``). The help is the field's docstring (read by
  :func:`optima_env.configtree.field_docs`, never re-typed), the value is parsed into the field's
  annotated type by :func:`optima_env.configtree.parse_value` (a bad value is one
  :class:`~optima_env.errors.ConfigError` line), a ``bool`` field is ``--x/--no-x``, a tuple field
  is repeatable, a field without a default is required.
* **Exit codes** (:data:`EXIT_OK` 0, :data:`EXIT_UNEXPECTED` 1, :data:`EXIT_ERROR` 2,
  :data:`EXIT_INTERRUPTED` 130): an :class:`~optima_env.errors.OptimaError` (bad input, a
  configuration or data error; argparse's own usage errors are turned into one) is one ``error:``
  line on stderr and exit 2; ``--debug`` prints its traceback first. Ctrl-C is one line, saying
  how to resume where the command can, and exit 130. Anything else is a bug: its traceback, one
  line saying so, exit 1.
* **Common flags** (:func:`add_common_flags`): ``--debug``, ``--log-level`` and ``--quiet``;
  :func:`setup_logging` applies them.

Our own code (about 200 lines) on top of argparse: tyro and simple-parsing would generate the
flags too, but they own the whole command line, where our commands keep a few hand-made options
(``--set NAME=VALUE``, ``--resume``) beside the generated ones, and the docstring reader already
exists in :mod:`optima_env.configtree`. No torch here (the bottom layer).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import traceback
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from optima_env import configtree
from optima_env.errors import ConfigError, OptimaError, RunConfigError

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNEXPECTED",
    "Flag",
    "Parser",
    "add_common_flags",
    "add_field_flags",
    "dataclass_from_args",
    "field_flags",
    "field_values",
    "flag_name",
    "one_line",
    "progress_silenced",
    "run_command",
    "setup_logging",
    "task_args",
]

EXIT_OK, EXIT_UNEXPECTED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
LOG_LEVELS = ("debug", "info", "warning", "error")
GENERATED = "config_fields"
"""Attribute set on every argparse action made by :func:`add_field_flags`: the dotted fields it sets
(``tests/test_cli_support.py`` checks that every flag naming a configuration field carries it)."""


def flag_name(field: str) -> str:
    """``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + field.replace("_", "-")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (whitespace collapsed)."""
    return " ".join(str(exc).split())


class Parser(argparse.ArgumentParser):
    """argparse with the help's layout kept and usage errors raised as :class:`ConfigError` (one
    ``error:`` line and exit 2 through :func:`run_command`, not argparse's usage block)."""

    def __init__(self, prog: str, description: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, description=description, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")


@dataclass(frozen=True)
class Flag:
    """A flag that sets fields of a configuration tree by dotted name (``--lambda-token`` ->
    ``reward.lambda_token``); several names are set to the same value (``--max-steps`` ->
    ``sft.max_steps`` and ``dpo.max_steps``). A ``switch`` takes no value and sets ``const``
    (``--full-finetune`` -> ``sft.lora = False``). ``also`` lists extra values the command
    accepts beside the field's own (the command resolves them, e.g. ``--profile auto``)."""

    flag: str
    fields: tuple[str, ...]
    const: Any = None
    """With ``switch``: the value the flag sets."""
    switch: bool = False
    """The flag takes no value and sets ``const``."""
    also: tuple[str, ...] = ()

    @staticmethod
    def of(flag: str, *fields: str, **kwargs: Any) -> Flag:
        return Flag(flag, tuple(fields), **kwargs)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _owner_doc(cls: type, dotted: str) -> str:
    """The docstring of the leaf ``dotted`` of the tree rooted at ``cls``."""
    owner = cls
    *sections, leaf = dotted.split(".")
    for part in sections:
        owner = typing.get_type_hints(owner)[part]
    return configtree.field_docs(owner).get(leaf, "")


def _metavar(type_: Any, also: Sequence[str] = ()) -> str | None:
    args = typing.get_args(type_)
    if typing.get_origin(type_) is Literal:
        return "{" + ",".join(map(str, (*args, *also))) + "}"
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1 and typing.get_origin(inner[0]) is Literal:
        return _metavar(inner[0], also)
    return None


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        return f" (default: {field.default})"
    if field.default_factory is dataclasses.MISSING:
        return " (required)"
    return ""


def add_field_flags(
    parser: argparse.ArgumentParser, cls: type, flags: Iterable[Flag] | None = None
) -> tuple[Flag, ...]:
    """Add one flag per field of the dataclass ``cls`` (``flags=None``), or the given aliases into
    the configuration tree rooted at ``cls``; returns the flags, for :func:`field_values`.

    Every value is collected as a string (tuple fields: a list) and parsed later into the field's
    type, so a bad value is a :class:`ConfigError` naming the flag, not an argparse usage block."""
    tree = configtree.leaves(cls)
    made = tuple(flags) if flags is not None else field_flags(cls)
    for spec in made:
        missing = [n for n in spec.fields if n not in tree]
        if missing:
            raise ConfigError(f"{spec.flag} names unknown fields {missing} of {cls.__name__}")
        type_, field = tree[spec.fields[0]]
        doc = _owner_doc(cls, spec.fields[0])
        target = "" if flags is None else f" [{', '.join(spec.fields)}]"
        kwargs: dict[str, Any] = {"dest": spec.dest, "default": None}
        if spec.switch:
            kwargs.update(action="store_const", const=spec.const)
            target = f" [sets {', '.join(spec.fields)} = {spec.const}]"
        elif type_ is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(type_) is tuple:
            kwargs.update(action="append", metavar="VALUE")
        else:
            kwargs["metavar"] = _metavar(type_, spec.also) or spec.dest.upper()
        if flags is None:
            kwargs["required"] = (
                field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            )
            target = _default_text(field)
        kwargs["help"] = (doc + target).replace("%", "%%")
        action = parser.add_argument(spec.flag, **kwargs)
        setattr(action, GENERATED, spec.fields)
    return made


def field_values(
    ns: argparse.Namespace, cls: type, flags: Iterable[Flag], *, keep_commas: Sequence[str] = ()
) -> dict[str, Any]:
    """The given flags' values by dotted field name, each parsed into its field's type (unset flags
    are left out). A repeated tuple flag's values are also split at commas, except the fields in
    ``keep_commas`` (whose values may hold commas)."""
    tree = configtree.leaves(cls)
    out: dict[str, Any] = {}
    for spec in flags:
        value = getattr(ns, spec.dest)
        if value is None:
            continue
        for name in spec.fields:
            type_ = tree[name][0]
            if spec.switch or type_ is bool:
                out[name] = value
            elif isinstance(value, list):
                items = value if name in keep_commas else [v for item in value for v in item.split(",")]
                item_type = (typing.get_args(type_) or (Any,))[0]
                items = [i.strip() for i in items if i.strip()]
                out[name] = tuple(configtree.parse_value(spec.flag, item_type, i) for i in items)
            elif value in spec.also:
                out[name] = value
            else:
                out[name] = configtree.parse_value(spec.flag, type_, value)
    return out


def field_flags(cls: type) -> tuple[Flag, ...]:
    """One flag per (top-level) field of the dataclass ``cls``: ``--kebab-name``."""
    return tuple(Flag(flag_name(n), (n,)) for n in configtree.leaves(cls) if "." not in n)


def dataclass_from_args(cls: type, ns: argparse.Namespace, **kwargs: Any) -> Any:
    """An instance of ``cls`` from the flags of ``add_field_flags(parser, cls)``; unset flags keep
    the field's default. The dataclass's own validation errors surface as they are."""
    return cls(**field_values(ns, cls, field_flags(cls), **kwargs))


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """``--debug``, ``--log-level`` and ``--quiet``, the same in every command."""
    parser.add_argument(
        "--debug", action="store_true", help="on an error, print its traceback before the one line"
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="level of the log lines on stderr (default: info)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="log warnings and errors only (--log-level warning)"
    )


def task_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--task-arg NAME=VALUE`` pairs as the task factory's keyword arguments.

    >>> task_args(("style=small", "limit=3", "strict_choice=false"))
    {'style': 'small', 'limit': 3, 'strict_choice': False}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            raise RunConfigError(
                f"--task-arg: expected NAME=VALUE with NAME a task factory argument, got {pair!r}; "
                "e.g. --task-arg style=small"
            )
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value
    return out


def setup_logging(
    ns: argparse.Namespace | None = None, *, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s"
) -> None:
    """Log to stderr at the level of ``--log-level`` / ``--quiet`` (``info`` before parsing)."""
    level = "info" if ns is None else ("warning" if ns.quiet and ns.log_level == "info" else ns.log_level)
    logging.basicConfig(level=level.upper(), format=fmt, force=ns is not None)


def _interrupt_line(on_interrupt: str | Callable[[KeyboardInterrupt], str], exc: KeyboardInterrupt) -> str:
    return on_interrupt(exc) if callable(on_interrupt) else on_interrupt


def run_command(
    body: Callable[[], int | None],
    *,
    argv: Sequence[str],
    on_interrupt: str | Callable[[KeyboardInterrupt], str],
    cleanup: Callable[[], object] | None = None,
) -> int:
    """Run a command's body and map what it raises to the shared exit codes (module docstring).

    ``on_interrupt`` is the Ctrl-C line (or makes it from the exception: how to resume, where the
    command can); ``cleanup`` runs on any failure before the message (e.g. removing a run folder
    that never started). ``--debug`` is read from ``argv`` so it also covers parsing errors."""
    debug = "--debug" in argv
    try:
        status = body()
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except OptimaError as exc:
        _run_cleanup(cleanup)
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        _run_cleanup(cleanup)
        print(_interrupt_line(on_interrupt, exc), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        _run_cleanup(cleanup)
        traceback.print_exc()
        print(f"error: unexpected {type(exc).__name__}: {one_line(exc)} (a bug: please report it with the "
              "traceback above)", file=sys.stderr)  # fmt: skip
        return EXIT_UNEXPECTED
    return EXIT_OK if status is None else status


def _run_cleanup(cleanup: Callable[[], object] | None) -> None:
    if cleanup is not None:
        cleanup()


_QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


@contextlib.contextmanager
def progress_silenced(active: bool = True) -> Any:
    """``--no-progress`` for the length of one command: every bar off (tqdm's ``TQDM_DISABLE``
    covers TRL's and transformers' trainers; the hub has its own switch), the environment restored
    afterwards, so a command run in-process (a test, a notebook) does not silence the bars of what
    runs after it, subprocesses included."""
    saved = {name: os.environ.get(name) for name in _QUIET}
    if active:
        os.environ.update(_QUIET)
    try:
        yield
    finally:
        if active:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
