"""What every stage shares: the run folder, its records and checkpoints, and the machinery around
training (the second layer, above :mod:`optima_trainers.config`).

* :mod:`~optima_trainers.run.folder`: the run folder (config, stages, state, metrics, lock);
* :mod:`~optima_trainers.run.run_format`: the run folder's on-disk format, and the one error an
  older one gets;
* :mod:`~optima_trainers.run.stages`: the records the host and the backends exchange;
* :mod:`~optima_trainers.run.records`: the preference-pair records;
* :mod:`~optima_trainers.run.checkpoint`: atomic checkpoints and the result record;
* :mod:`~optima_trainers.run.adapters`: a LoRA stage's adapter, merged weights rebuilt from it, and
  the stages' adapters stacked;
* :mod:`~optima_trainers.run.export`: a trained model's weight change as a LoRA adapter;
* :mod:`~optima_trainers.run.lora_svd`: the export's SVD of a weight change into LoRA factors;
* :mod:`~optima_trainers.run.memory`: what one phase held is freed before the next starts;
* :mod:`~optima_trainers.run.memory_plan`: each phase's GPU memory, planned before the first token;
* :mod:`~optima_trainers.run.trl`: what the SFT and DPO trainers share around TRL;
* :mod:`~optima_trainers.run.tracking`: per-stage metrics to tensorboard, trackio or wandb;
* :mod:`~optima_trainers.run.provenance`: the git commit a run or an export records;
* :mod:`~optima_trainers.run.faults`: fault points for the crash-and-resume tests.
"""
