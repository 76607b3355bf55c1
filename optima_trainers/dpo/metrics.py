"""What a DPO stage records of its training, to watch it learn (spec §6.5; issue: DPO you can watch).

TRL's ``DPOTrainer`` logs its metrics per logging step (:data:`DPO_METRICS` but the loss's parts);
:func:`split_loss_trainer` adds the loss split into its DPO and NLL parts, which TRL does not
log; :func:`epoch_summary`, :func:`eval_summary` and :func:`result_metrics` turn the log history
into the stage's scalar summary (per-epoch means, the last held-out evaluation). They are written
here because TRL keeps no per-epoch summary: it logs each logging window and each evaluation, and
the stage's record needs a few scalars per stage (the tracker's stage point, the demo's committed
metrics) beside the whole history.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from optima_env.errors import require

__all__ = ["DPO_METRICS", "epoch_summary", "eval_summary", "numbers", "result_metrics", "split_loss_trainer"]

logger = logging.getLogger(__name__)

DPO_METRICS = (
    "loss",
    "loss/dpo",
    "loss/nll",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)
"""The per-step metrics a stage summarizes per epoch and on its held-out pairs (TRL's names, and
``loss/dpo`` / ``loss/nll`` from :func:`split_loss_trainer`)."""


def split_loss_trainer(credited_alpha: float | None = None) -> Any:
    """TRL's ``DPOTrainer``, plus the loss split into its DPO and NLL parts (and, with
    ``credited_alpha``, the NLL term on task-credited pairs only).

    TRL 1.16 logs, per logging step (and as ``eval_*`` when evaluating), ``rewards/chosen``,
    ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``,
    ``logps/rejected``, ``logits/*``, ``entropy`` and ``mean_token_accuracy``, but of a loss made
    of several terms (RPO: ``loss_type=["sigmoid", "sft"]``) only the weighted sum, ``loss``. This
    subclass adds the two parts, which TRL does not log, to TRL's own metric buffer (so TRL
    averages them over the logging window and logs them like its own metrics, ``eval_`` prefixed in
    evaluation, to the log history and ``report_to``):

    * ``loss/nll``: the ``sft`` term exactly as TRL computes it (the mean negative log-likelihood
      over the chosen completions' tokens of the batch), from the log-probabilities of the same
      forward pass (no extra forward); logged in plain DPO too, where it is not in the loss;
    * ``loss/dpo``: the loss minus the weighted NLL term, i.e. the sigmoid DPO term.

    ``credited_alpha`` (``dpo.rpo_scope="credited"``): TRL's ``sft`` term is one mean over every
    chosen token of the batch and cannot leave pairs out, so TRL runs plain DPO and this subclass
    adds ``credited_alpha`` times the mean NLL over the chosen tokens of the pairs whose
    ``nll_weight`` column is 1 (chosen side with task credit > 0; 0 when a batch has none). The
    column is kept through TRL's column filter and collated beside TRL's batch; ``loss/nll`` is then
    that credited NLL, the term in the loss.

    With ``dpo.precompute_ref_log_probs`` the reference log-probs computed before the first step
    are kept in memory (every process gathers them all) rather than in TRL's cache file.
    """
    trl = _trl_with_precompute_hook()

    class _Policy:
        """The policy model as ``_compute_loss`` calls it, keeping its first output."""

        def __init__(self, model: Any) -> None:
            self.model, self.output = model, None

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            out = self.model(*args, **kwargs)
            if self.output is None:  # the loss's forward (return_outputs may call it again)
                self.output = out
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self.model, name)

    class SplitLossDPOTrainer(trl.DPOTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if credited_alpha is not None:
                self.data_collator = _WithNLLWeights(self.data_collator)

        def _set_signature_columns_if_needed(self) -> None:
            super()._set_signature_columns_if_needed()
            if credited_alpha is not None and "nll_weight" not in self._signature_columns:
                self._signature_columns = [*self._signature_columns, "nll_weight"]

        def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
            return _precompute_ref_logps_in_memory(self, dataset, name, batch_size)

        def _compute_loss(self, model: Any, inputs: Any, return_outputs: bool) -> Any:
            weights = inputs.get("nll_weight")
            inputs = {k: v for k, v in inputs.items() if k != "nll_weight"}  # not a model input
            policy = _Policy(model)
            result = super()._compute_loss(policy, inputs, return_outputs)
            loss = result[0] if return_outputs else result
            mask = inputs["completion_mask"][..., 1:]
            log_probs = policy.output.log_probs[:, -mask.size(1) :]
            chosen_mask = mask.chunk(2, dim=0)[0].bool()
            chosen_log_probs = log_probs.chunk(2, dim=0)[0]
            if credited_alpha is None:
                nll = -chosen_log_probs.detach()[chosen_mask].mean()
                weight = sum(w for t, w in zip(self.loss_types, self.loss_weights, strict=True) if t == "sft")
            else:  # the NLL over the credited pairs' chosen tokens, added to TRL's plain DPO loss
                token_weights = chosen_mask * weights.to(chosen_log_probs.dtype).unsqueeze(1)
                nll_grad = -(chosen_log_probs * token_weights).sum() / token_weights.sum().clamp(min=1.0)
                loss = loss + credited_alpha * nll_grad
                result = (loss, result[1]) if return_outputs else loss
                nll, weight = nll_grad.detach(), credited_alpha
            mode = "train" if self.model.training else "eval"
            gather = self.accelerator.gather_for_metrics
            self._metrics[mode]["loss/nll"].append(gather(nll).mean().item())
            self._metrics[mode]["loss/dpo"].append(gather(loss.detach() - weight * nll).mean().item())
            return result

    return SplitLossDPOTrainer


class _WithNLLWeights:
    """TRL's preference collator, plus the rows' ``nll_weight`` as a float tensor of the batch."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        torch = require("torch", "train")
        batch = self.inner(examples)
        batch["nll_weight"] = torch.tensor([float(e["nll_weight"]) for e in examples])
        return batch


def numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a log record (as floats)."""
    return {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def epoch_summary(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per epoch ``k`` (1, 2, ...): ``epoch_<k>/<m>``, the mean of each :data:`DPO_METRICS` ``m``
    over that epoch's training-step logs, and ``epoch_<k>/eval_<m>``, the held-out evaluation
    logged at its end (when there is one).

    >>> epoch_summary([{"loss": 1.0, "epoch": 0.5, "step": 1}, {"loss": 3.0, "epoch": 1.0, "step": 2},
    ...                {"eval_loss": 2.5, "epoch": 1.0, "step": 2}, {"loss": 0.5, "epoch": 1.5, "step": 3}])
    {'epoch_1/loss': 2.0, 'epoch_1/eval_loss': 2.5, 'epoch_2/loss': 0.5}
    """
    steps: dict[int, dict[str, list[float]]] = {}
    evals: dict[int, dict[str, float]] = {}
    for record in history:
        if "epoch" not in record:
            continue
        epoch = max(1, math.ceil(round(float(record["epoch"]), 6)))
        if "loss" in record:  # a training step (the final summary has train_loss, an evaluation eval_loss)
            for name in DPO_METRICS:
                if name in record:
                    steps.setdefault(epoch, {}).setdefault(name, []).append(float(record[name]))
        elif "eval_loss" in record:
            evals[epoch] = {
                f"eval_{m}": float(record[f"eval_{m}"]) for m in DPO_METRICS if f"eval_{m}" in record
            }
    out: dict[str, float] = {}
    for epoch in sorted(steps.keys() | evals.keys()):
        out |= {f"epoch_{epoch}/{m}": sum(v) / len(v) for m, v in steps.get(epoch, {}).items()}
        out |= {f"epoch_{epoch}/{m}": v for m, v in evals.get(epoch, {}).items()}
    return out


def eval_summary(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The last held-out evaluation of the history: ``eval_<m>`` for each :data:`DPO_METRICS` ``m``
    it has (empty without one)."""
    last = next((h for h in reversed(history) if "eval_loss" in h), None)
    return (
        {}
        if last is None
        else {f"eval_{m}": float(last[f"eval_{m}"]) for m in DPO_METRICS if f"eval_{m}" in last}
    )


def result_metrics(
    history: Sequence[Mapping[str, Any]], train_metrics: Mapping[str, Any], *, dropped: int, eval_pairs: int
) -> dict[str, float]:
    """A stage's summary: ``num_dropped``, ``eval_pairs``, the last logged step's
    ``rewards/accuracies`` and ``rewards/margins``, ``train_runtime``, the per-epoch means
    (:func:`epoch_summary`) and the last held-out evaluation (:func:`eval_summary`)."""
    metrics: dict[str, float] = {"num_dropped": float(dropped), "eval_pairs": float(eval_pairs)}
    logged = [h for h in history if "loss" in h]
    for key in ("rewards/accuracies", "rewards/margins", "train_runtime"):
        source = logged[-1] if logged and key in logged[-1] else train_metrics
        if key in source:
            metrics[key] = float(source[key])
    return metrics | epoch_summary(history) | eval_summary(history)


def _precompute_ref_logps_in_memory(trainer: Any, dataset: Any, name: str, batch_size: int) -> Any:
    """TRL's precomputed reference log-probs (``dpo.precompute_ref_log_probs``) for ``trainer`` (a
    :func:`split_loss_trainer`), added to ``dataset`` in memory: every process computes its shard
    and gathers every value.

    TRL 1.16 passes them through a cache file named after the dataset's files, which a dataset
    built in memory does not have: each process then looks in its own temporary folder under a
    random name, and every process but the main one fails."""
    torch, trl = require("torch", "train"), require("trl", "train")
    loader = trainer.accelerator.prepare(
        torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            collate_fn=trainer.data_collator,
            num_workers=trainer.args.dataloader_num_workers,
            pin_memory=trainer.args.dataloader_pin_memory,
            shuffle=False,
        )
    )
    model = trainer.ref_model or trainer.model
    if trainer.ref_model is None and trainer.is_deepspeed_enabled:  # TRL's inference engine (ZeRO-3)
        if trainer._precompute_engine is None:
            trainer._precompute_engine = trl.models.prepare_deepspeed(trainer.model, trainer.accelerator)
        model = trainer._precompute_engine
    chosen, rejected = [], []
    for batch in loader:
        pair = trainer.accelerator.gather_for_metrics(trainer.compute_ref_log_probs(model, batch))
        chosen.append(pair[0].cpu())
        rejected.append(pair[1].cpu())
    chosen_logps, rejected_logps = torch.cat(chosen).tolist(), torch.cat(rejected).tolist()
    logger.info("reference log-probs of the %d %s pairs computed before training", len(chosen_logps), name)
    with_chosen = dataset.add_column("ref_chosen_logps", chosen_logps)
    return with_chosen.add_column("ref_rejected_logps", rejected_logps)


def _trl_with_precompute_hook() -> Any:
    """TRL, once it has the method :func:`split_loss_trainer` overrides (TRL 1.16's)."""
    trl = require("trl", "train")
    if not hasattr(trl.DPOTrainer, "_precompute_ref_logps"):
        raise ImportError(
            f"optima's DPO trainer overrides trl.DPOTrainer._precompute_ref_logps (TRL 1.16), which TRL "
            f"{trl.__version__} lacks; install trl==1.16.*"
        )
    return trl
