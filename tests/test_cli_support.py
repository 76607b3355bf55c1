"""The shared command-line support (optima_env.cli_support): flags generated from dataclasses with
their docstrings as help, aliases into a configuration tree, the shared exit codes, ``--debug``
and logging; and, structurally, that every command's flag naming a configuration field is
generated (none is written by hand with its own type and help)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Literal

import pytest

from optima_env.cli_support import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    GENERATED,
    Flag,
    Parser,
    add_common_flags,
    add_field_flags,
    dataclass_from_args,
    field_values,
    run_command,
    setup_logging,
)
from optima_env.configtree import leaves
from optima_env.errors import ConfigError, DataError


@dataclass(frozen=True, kw_only=True)
class Opt:
    learning_rate: float = 1e-4
    """Peak learning rate of the optimizer."""
    lora: bool = True
    """Train a LoRA adapter instead of every weight."""


@dataclass(frozen=True, kw_only=True)
class Tree:
    opt: Opt = field(default_factory=Opt)
    """The optimizer section."""
    steps: int | None = None
    """Stop after this many steps."""


@dataclass(frozen=True, kw_only=True)
class Args:
    out: str
    """Where the results go (50% of them, at least)."""
    episodes: int = 4
    """Episodes per task."""
    methods: tuple[str, ...] = ()
    """Methods to play (repeatable or comma-separated)."""
    order: Literal["code", "paper"] = "code"
    """Which order the selection runs in."""
    progress: bool = True
    """Show progress bars."""


def _parser(cls: type = Args, flags=None) -> argparse.ArgumentParser:
    parser = Parser("prog", "A test command.")
    add_field_flags(parser, cls, flags)
    add_common_flags(parser)
    return parser


def _help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return action.help


def test_one_flag_per_field_typed_with_its_docstring_as_help() -> None:
    parser = _parser()
    assert _help_of(parser, "--episodes") == "Episodes per task. (default: 4)"
    assert _help_of(parser, "--out") == "Where the results go (50%% of them, at least). (required)"
    shown = " ".join(parser.format_help().split())
    assert "--out OUT Where the results go (50% of them, at least). (required)" in shown
    assert "--order {code,paper} Which order the selection runs in. (default: code)" in shown
    argv = ["--out", "r", "--episodes", "7", "--methods", "cot,sc", "--methods", "mad", "--no-progress"]
    args = dataclass_from_args(Args, parser.parse_args(argv))
    assert args == Args(out="r", episodes=7, methods=("cot", "sc", "mad"), progress=False)
    assert dataclass_from_args(Args, parser.parse_args(["--out", "r"])) == Args(out="r")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--out", "r", "--episodes", "many"],
            "config field '--episodes': expected a number (int), got 'many'",
        ),
        (
            ["--out", "r", "--order", "fast"],
            "config field '--order': expected one of 'code', 'paper', got 'fast'",
        ),
        ([], "the following arguments are required: --out (see prog --help)"),
        (["--out", "r", "--bogus"], "unrecognized arguments: --bogus (see prog --help)"),
    ],
)
def test_a_bad_value_or_flag_is_a_config_error(argv, message) -> None:
    with pytest.raises(ConfigError) as info:
        dataclass_from_args(Args, _parser().parse_args(argv))
    assert str(info.value) == message


def test_an_alias_sets_dotted_fields_with_the_fields_help_and_type() -> None:
    flags = (
        Flag.of("--lr", "opt.learning_rate"),
        Flag.of("--full", "opt.lora", const=False, switch=True),
        Flag.of("--steps", "steps"),
    )
    parser = _parser(Tree, flags)
    assert _help_of(parser, "--lr") == "Peak learning rate of the optimizer. [opt.learning_rate]"
    assert (
        _help_of(parser, "--full") == "Train a LoRA adapter instead of every weight. [sets opt.lora = False]"
    )
    values = field_values(parser.parse_args(["--lr", "3e-5", "--full", "--steps", "none"]), Tree, flags)
    assert values == {"opt.learning_rate": 3e-5, "opt.lora": False, "steps": None}
    assert field_values(parser.parse_args([]), Tree, flags) == {}  # unset flags set nothing
    with pytest.raises(ConfigError, match="unknown fields"):
        add_field_flags(Parser("p"), Tree, [Flag.of("--x", "opt.nope")])


def _run(body, *argv: str, on_interrupt="interrupted; rerun to resume", cleanup=None) -> int:
    return run_command(body, argv=list(argv), on_interrupt=on_interrupt, cleanup=cleanup)


def _raise(exc: BaseException):
    def body() -> None:
        raise exc

    return body


def test_exit_codes_and_messages(capsys) -> None:
    cleaned = []
    assert _run(lambda: None) == EXIT_OK == 0
    assert _run(_raise(DataError("bad\n  row 3")), cleanup=lambda: cleaned.append(1)) == EXIT_ERROR == 2
    assert capsys.readouterr().err == "error: bad row 3\n" and cleaned == [1]  # one line, no traceback
    assert _run(_raise(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "interrupted; rerun to resume\n"
    assert _run(_raise(KeyboardInterrupt("x")), on_interrupt=lambda exc: f"stopped at {exc}") == 130
    assert capsys.readouterr().err == "stopped at x\n"
    assert _run(_raise(ZeroDivisionError("oops"))) == EXIT_UNEXPECTED == 1
    err = capsys.readouterr().err  # a bug: its traceback, then one line saying so
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("error: unexpected ZeroDivisionError: oops (a bug")


def test_debug_prints_the_traceback_before_the_one_line(capsys) -> None:
    assert _run(_raise(DataError("bad row")), "--debug") == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "DataError: bad row" in err
    assert err.strip().splitlines()[-1] == "error: bad row"


def test_help_and_usage_errors_through_a_real_parser(capsys) -> None:
    assert _run(lambda: _parser().parse_args(["--help"])) == 0
    assert "Episodes per task." in capsys.readouterr().out
    assert _run(lambda: _parser().parse_args(["--episodes", "2"])) == 2
    assert capsys.readouterr().err == "error: the following arguments are required: --out (see prog --help)\n"


def test_log_level_and_quiet_set_the_root_level() -> None:
    root = logging.getLogger()
    old = root.level
    try:
        for argv, level in (
            ([], logging.INFO),
            (["--quiet"], logging.WARNING),
            (["--log-level", "debug"], logging.DEBUG),
        ):
            setup_logging(_parser().parse_args(["--out", "r", *argv]))
            assert root.level == level, argv
    finally:
        root.setLevel(old)


# -- structure: every command's configuration flags are generated --------------------------------
def _commands() -> list[tuple[str, argparse.ArgumentParser, set[str]]]:
    """``(command, parser, names of the configuration fields it could set)``, for every CLI."""
    from benchmarks.args import BenchConfig, RunArgs
    from benchmarks.args import build_parser as bench_parser
    from benchmarks.throughput.rollout_bench import SuiteConfig
    from benchmarks.throughput.rollout_bench import build_parser as rollout_parser
    from optima_trainers.cli.export import ExportArgs
    from optima_trainers.cli.export import build_parser as export_parser
    from optima_trainers.cli.train import build_parser as train_parser
    from optima_trainers.config.train import TrainConfig

    def names(*classes: type) -> set[str]:
        out = set()
        for cls in classes:
            for dotted in leaves(cls):
                out |= {dotted.replace(".", "_"), dotted.rsplit(".", 1)[-1]}
        return out

    return [
        ("optima-train", train_parser(), names(TrainConfig)),
        ("optima-bench", bench_parser(), names(RunArgs, BenchConfig)),
        ("optima-rollout-bench", rollout_parser(), names(SuiteConfig)),
        ("optima-export", export_parser(), names(ExportArgs)),
    ]


def test_no_command_declares_a_configuration_flag_by_hand() -> None:
    """A flag whose name or destination is a configuration field comes from add_field_flags (its
    type and help are the field's): none is written by hand with re-typed help."""
    by_hand = []
    for command, parser, fields in _commands():
        generated = [a for a in parser._actions if hasattr(a, GENERATED)]
        assert generated, f"{command}: no generated flag"
        for action in parser._actions:
            flags = {o.lstrip("-").replace("-", "_") for o in action.option_strings if o.startswith("--")}
            if (flags | {action.dest}) & fields and not hasattr(action, GENERATED):
                by_hand.append(f"{command} {action.option_strings}")
    assert not by_hand, by_hand


def test_the_trainers_flags_show_their_fields_docstrings() -> None:
    from optima_env.configtree import describe
    from optima_trainers.cli.train import FLAGS
    from optima_trainers.config.train import TrainConfig

    parser = _commands()[0][1]
    helps = {o: a.help.replace("%%", "%") for a in parser._actions for o in a.option_strings}
    docs = {line.split(" (", 1)[0]: line.split("): ", 1)[1] for line in describe(TrainConfig)}
    for spec in FLAGS:
        assert docs[spec.fields[0]] and helps[spec.flag].startswith(docs[spec.fields[0]]), spec.flag
    assert helps["--lambda-token"].startswith("λ_token")


def test_no_progress_holds_for_one_command_and_leaves_the_environment_as_it_was(monkeypatch, capsys) -> None:
    """An in-process ``--no-progress`` command (a test, a notebook) must not silence the bars of
    what runs after it: subprocesses inherit os.environ (a CI run failed on exactly that)."""
    import os

    from optima_env.cli_support import progress_silenced
    from optima_trainers.cli.train import main

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    with progress_silenced():
        assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert "TQDM_DISABLE" not in os.environ and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
    assert main(["--task", "synth", "--print-config", "--no-progress"]) == 0
    capsys.readouterr()
    assert "TQDM_DISABLE" not in os.environ
