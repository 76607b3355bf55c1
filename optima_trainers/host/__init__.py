"""The host loop and its run.

* :mod:`~optima_trainers.host.loop`: generate → score → select → deliver → train → next model;
* :mod:`~optima_trainers.host.runs`: the run folder (config, stages, state, metrics, lock);
* :mod:`~optima_trainers.host.stages`: the records the host and the backends exchange;
* :mod:`~optima_trainers.host.checkpoint`: atomic checkpoints and the result record;
* :mod:`~optima_trainers.host.adapters`: a LoRA stage's adapter, and merged weights rebuilt from it;
* :mod:`~optima_trainers.host.memory`: what one phase held is freed before the next starts;
* :mod:`~optima_trainers.host.memory_plan`: each phase's GPU memory, planned before the first token;
* :mod:`~optima_trainers.host.tracking`: per-stage metrics to tensorboard, trackio or wandb;
* :mod:`~optima_trainers.host.provenance`: the git commit a run or an export records;
* :mod:`~optima_trainers.host.faults`: fault points for the crash-and-resume tests.
"""
