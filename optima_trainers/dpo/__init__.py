"""DPO stages.

* :mod:`~optima_trainers.dpo.pairs`: from tree pairs to a DPO dataset (spec §6.4);
* :mod:`~optima_trainers.dpo.trainer`: DPO and RPO on TRL's ``DPOTrainer``;
* :mod:`~optima_trainers.dpo.metrics`: what a DPO stage records, to watch it learn.
"""
