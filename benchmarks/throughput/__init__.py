"""Throughput: speed suites, each reporting ratios measured side by side in one run.

* :mod:`~benchmarks.throughput.rollout_bench`: rollout engines and drivers side by side
  (``--suite rollout``), its phases (:mod:`~benchmarks.throughput.rollout_phases`, one
  subprocess each; the driver phases in :mod:`~benchmarks.throughput.rollout_drivers`, the engine
  comparison and the precision's fidelity in :mod:`~benchmarks.throughput.rollout_engines`, the
  floor of the engine's counted work in :mod:`~benchmarks.throughput.rollout_floor`) and
  tables (:mod:`~benchmarks.throughput.rollout_report`; the EOS workload's in
  :mod:`~benchmarks.throughput.rollout_eos_report`);
* :mod:`~benchmarks.throughput.handoff_bench`: a stage's handoff to the next, from "trained"
  to the next stage's first token, per weight-delivery path (``--suite handoff``);
* :mod:`~benchmarks.throughput.loop_bench`: one training iteration per phase, per engine
  (``--suite loop``);
* :mod:`~benchmarks.throughput.lora_base`: one engine per run, each stage's policy as weights
  reloaded in place or as a LoRA adapter on the base, readability from the base's
  ``prompt_logprobs`` (``python -m benchmarks.throughput.lora_base``); its tables and GPU memory
  arithmetic in :mod:`~benchmarks.throughput.lora_base_report`;
* :mod:`~benchmarks.throughput.gpu_check`: the prepared device check of a GPU run.
* :mod:`~benchmarks.throughput.gpu_check_phases`: its phases, shapes and JSON recorder.
* :mod:`~benchmarks.throughput.as_filed`: the engine of the commit issue 49 was filed at against
  today's ``engine_old`` and ``engine``, one run (``python -m benchmarks.throughput.as_filed``).
"""
