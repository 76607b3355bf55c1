"""Evaluation: methods scored on a task's held-out instances, resumably, into result rows.

* :mod:`~benchmarks.evaluation.methods`: the methods of the table (baselines, trained
  checkpoints, inference scaling) and how one episode of each is played;
* :mod:`~benchmarks.evaluation.wrappers`: how a method plays a task (one agent, styled prompts,
  one hand, swapped evidence);
* :mod:`~benchmarks.evaluation.controls`: the shortcut ceiling, one hand and counterfactuals;
* :mod:`~benchmarks.evaluation.prompts`: the baselines' prompts (CoT, MAD, AutoForm; spec §8.2);
* :mod:`~benchmarks.evaluation.policies`: a model through a backend, or the scripted policy;
* :mod:`~benchmarks.evaluation.suite_spec`: a suite's defaults (:class:`Suite`);
* :mod:`~benchmarks.evaluation.units`: a run's (method, task) units of work;
* :mod:`~benchmarks.evaluation.store`: the append-only episode file a run resumes from;
* :mod:`~benchmarks.evaluation.outputs`: from stored episodes to result rows and files;
* :mod:`~benchmarks.evaluation.trained`: the task arguments and caps of a checkpoint's training run.
"""
