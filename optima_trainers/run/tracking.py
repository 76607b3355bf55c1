"""Per-stage metrics to the tracker named by ``report_to`` (tensorboard, trackio, wandb).

TRL's trainers report their own step metrics to ``report_to`` inside each stage. This plugin, which
the host loop registers for a run whose ``report_to`` is not ``none``, adds one point per stage on
``optima_iteration_end``: the stage's score, tokens in all and per agent, the reward and its terms,
the selection and pair counts, the training summary and the time per phase. It uses each
tracker's own library (``torch.utils.tensorboard``, ``trackio``, ``wandb``), in a run folder's
``tracking/`` (tensorboard) or the tracker's project ``optima`` named after the run folder.

A DPO stage's point carries its per-epoch means and its last held-out evaluation
(``train/epoch_<k>/rewards/accuracies``, ``train/eval_rewards/margins``, ``train/eval_loss/nll``,
...: :func:`optima_trainers.dpo.metrics.result_metrics`); its every step, with the loss split into
``loss/dpo`` and ``loss/nll``, reaches the tracker through TRL's own ``report_to`` logging (for
tensorboard, in the stage's ``trainer/`` folder), and the stage record keeps it
(``result.json``'s ``history``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optima_env.errors import require
from optima_env.hookspecs import hookimpl

__all__ = ["StageTracker"]


class StageTracker:
    """Logs each stage's metrics (``optima_iteration_end``) to ``report_to``'s tracker."""

    report_to: str
    """``tensorboard``, ``trackio`` or ``wandb``."""
    root: Path
    """The run folder (tensorboard writes under ``root / "tracking"``)."""

    def __init__(self, report_to: str, root: Path) -> None:
        self.report_to = report_to
        self.root = Path(root)
        self._writer: Any = None

    def _open(self) -> Any:
        if self._writer is None:
            if self.report_to == "tensorboard":
                require("tensorboard", "track")
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=str(self.root / "tracking"))
            elif self.report_to == "trackio":
                trackio = require("trackio", "track")
                trackio.init(project="optima", name=self.root.name, resume="allow")
                self._writer = trackio
            else:
                wandb = require("wandb", "track")
                wandb.init(project="optima", name=self.root.name, resume="allow")
                self._writer = wandb
        return self._writer

    @hookimpl
    def optima_iteration_end(self, iteration: int, metrics: Mapping[str, float]) -> None:
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        writer = self._open()
        if self.report_to == "tensorboard":
            for key, value in scalars.items():
                writer.add_scalar(f"stage/{key}", value, iteration)
            writer.flush()
        else:
            writer.log({f"stage/{k}": v for k, v in scalars.items()}, step=iteration)

    def close(self) -> None:
        """Flush and close the tracker."""
        if self._writer is None:
            return
        if self.report_to == "tensorboard":
            self._writer.close()
        else:
            self._writer.finish()
        self._writer = None
