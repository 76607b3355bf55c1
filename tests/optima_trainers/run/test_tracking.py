"""Per-stage metrics reach the tracker named by report_to, read back from the tracker's own files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optima_trainers.run.tracking import StageTracker
from tests.helpers import REPO_ROOT

STAGES = [
    (0, {"rollout/task_score": 0.25, "rollout/tokens/Alice": 30.0, "reward/readability": 0.4, "note": "x"}),
    (1, {"rollout/task_score": 0.5, "rollout/tokens/Alice": 20.0, "reward/readability": 0.45}),
]


def test_stage_metrics_go_to_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = StageTracker("tensorboard", tmp_path)
    for iteration, metrics in STAGES:
        tracker.optima_iteration_end(iteration=iteration, metrics=metrics)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tracking"))
    events.Reload()
    assert "stage/note" not in events.Tags()["scalars"]  # not a number: not a scalar
    score = [(e.step, e.value) for e in events.Scalars("stage/rollout/task_score")]
    assert score == [(0, 0.25), (1, 0.5)]
    assert [e.value for e in events.Scalars("stage/rollout/tokens/Alice")] == [30.0, 20.0]


def test_stage_metrics_go_to_trackio(tmp_path: Path) -> None:
    pytest.importorskip("trackio")
    code = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from optima_trainers.run.tracking import StageTracker
        from trackio.sqlite_storage import SQLiteStorage
        root = Path({str(tmp_path / "run-a")!r})
        tracker = StageTracker("trackio", root)
        for iteration, metrics in {STAGES!r}:
            tracker.optima_iteration_end(iteration=iteration, metrics=metrics)
        tracker.close()
        logs = SQLiteStorage.get_logs("optima", run="run-a")
        keep = [{{k: v for k, v in r.items() if k.startswith("stage/") or k == "step"}} for r in logs]
        print(json.dumps(keep))
        """
    )
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(r["step"], r["stage/rollout/task_score"]) for r in rows] == [(0, 0.25), (1, 0.5)]
