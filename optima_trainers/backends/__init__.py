"""Trainer backends: the contract and the built-ins, registered as a third party's would be.

* :mod:`~optima_trainers.backends.contract`: ``TrainerBackend``, ``StageContext`` and the iSFT,
  iDPO and iSFT-DPO backends;
* :mod:`~optima_trainers.backends.builtin`: their registration through the ``optima`` hooks;
* :mod:`~optima_trainers.backends.grpo`: TRL's ``GRPOTrainer`` on the Optima reward.
"""
