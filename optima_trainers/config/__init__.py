"""The one configuration tree of a run (the bottom layer: imports no other folder of the package).

* :mod:`~optima_trainers.config.train`: ``TrainConfig``, its layers and ``resolve_config``;
* :mod:`~optima_trainers.config.sections`: the ``generation`` section;
* :mod:`~optima_trainers.config.tree`: the ``tree`` section;
* :mod:`~optima_trainers.config.training`: the ``sft``, ``dpo`` and ``selection`` sections (and
  the LoRA options the first two share);
* :mod:`~optima_trainers.config.env`: the env settings of a run's rollouts (``EnvSettings``);
* :mod:`~optima_trainers.config.presets`: reward presets, fidelity switches, compute profiles.
"""
