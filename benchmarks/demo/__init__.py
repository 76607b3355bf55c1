"""The demo: Optima's Table 1 on 2 CPU cores (``python -m benchmarks.run --suite demo``).

* :mod:`~benchmarks.demo.suite`: the suite's steps (train, export, evaluate, report);
* :mod:`~benchmarks.demo.tasks`: the recipe (tasks, trainers, training and evaluation settings);
* :mod:`~benchmarks.demo.train`: training runs through the trainers' public API and their record;
* :mod:`~benchmarks.demo.train_one`: one run of the recipe trained alone, beside the others;
* :mod:`~benchmarks.demo.probe`: one iteration on a few dozen instances before the full runs;
* :mod:`~benchmarks.demo.control`: M_0 (the shared initialization) and paired differences to it;
* :mod:`~benchmarks.demo.shortcut`: the trained systems checked against the controls;
* :mod:`~benchmarks.demo.report`, :mod:`~benchmarks.demo.plots`: summaries, pages and plots;
* :mod:`~benchmarks.demo.rerender`: re-render the committed tables without running a model;
* :mod:`~benchmarks.demo.clock`: the wall time of every invocation, kept across crashes;
* :mod:`~benchmarks.demo.dpo_ref`: the demo's DPO stage with the reference log-probs computed every
  step or once before the first (``python -m benchmarks.demo.dpo_ref``).
"""
