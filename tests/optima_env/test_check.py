"""``python -m optima_env.check TASK`` through the real command in subprocesses: one line per check
on a built-in task, and on a plugin task with a bug the passed checks, then one ``error:`` line
naming the failing check, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import REPO_ROOT

BROKEN_PLUGIN = '''
from optima_env import AgentView, TaskSpec, hookimpl
from tests.helpers import TinyTask


class SplitsOnTheTag(TinyTask):
    """A plugin author's bug: the answer is read by splitting on the tag, which fails without one."""

    family = "debate"

    def views(self, sample, *, rng, format_index=None):
        prompt = f"Answer in <A></A>. {sample.question}"
        return {a: AgentView(agent=a, system_prompt=prompt, base_system_prompt=prompt) for a in self.agents}

    def extract_answer(self, text):
        return text.split("<A>")[1].split("</A>")[0]


@hookimpl
def optima_register_tasks():
    return [TaskSpec(id="acme/broken-v0", factory=SplitsOnTheTag, family="debate")]
'''


def check(*argv: str, path: str = "") -> subprocess.CompletedProcess[str]:
    paths = (path, str(REPO_ROOT), str(REPO_ROOT / "plugins"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("OPTIMA_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, "-m", "optima_env.check", *argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def install_broken_plugin(root: Path) -> str:
    """A distribution on ``root`` whose ``optima`` entry point registers ``acme/broken-v0``."""
    (root / "acme_broken_task.py").write_text(textwrap.dedent(BROKEN_PLUGIN), encoding="utf-8")
    dist = root / "acme_broken_task-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-broken-task\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[optima]\nbroken = acme_broken_task\n")
    return str(root)


def test_a_built_in_task_passes_with_one_line_per_check() -> None:
    proc = check("ie/synth-v0", "--samples", "2", "--cycles", "5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    checks = [line.split()[1] for line in lines if line.startswith("ok  ")]
    assert checks == ["agents", "samples", "views", "formats", "evidence", "extract", "score",
                      "episode_seed", "api_test", "api_test", "api_test"]  # fmt: skip
    suites = [line.split("PettingZoo ")[1] for line in lines if "PettingZoo" in line]
    assert suites == ["api_test, 5 cycles", "seed_test, 5 cycles", "parallel_api_test, 5 cycles"]
    assert lines[-1].startswith("ie/synth-v0: every check passed (agents, samples,")


def test_a_broken_task_prints_what_passed_then_one_error_line_naming_the_check(tmp_path) -> None:
    proc = check("acme/broken-v0", path=install_broken_plugin(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert [line.split()[1] for line in proc.stdout.splitlines()] == ["agents", "samples", "views", "formats"]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "task 'acme/broken-v0' fails check 'extract': extract_answer('') raised IndexError" in errors[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path) -> None:
    for argv, message in (
        (["nope/x-v0"], "no task 'nope/x-v0'; registered: "),
        (["ie/synth-v0", "--task-arg", "hops"], "--task-arg: expected NAME=VALUE"),
        (["ie/synth-v0", "--samples", "0"], "--samples must be at least 1, got 0"),
        (["ie/synth-v0", "--data-dir", str(tmp_path / "missing")], "--data-dir"),
    ):
        proc = check(*argv)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], (argv, proc.stderr[-1000:])
        assert proc.stdout == ""
