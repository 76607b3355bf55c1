"""A stage's generation.

* :mod:`~optima_trainers.generation.stage`: the policies, env options and scorer of a run, and
  each stage's generation;
* :mod:`~optima_trainers.generation.engines`: policies per stage; one vLLM engine per run with
  in-place weights; OpenAI-compatible servers fed each stage's weights;
* :mod:`~optima_trainers.generation.servers`: the servers' conversations in flight, and each
  stage's weights as one adapter (the stages' own adapters stacked, exact);
* :mod:`~optima_trainers.generation.samples`: sampled stages (iSFT and every SFT stage);
* :mod:`~optima_trainers.generation.tree_stage`: tree stages (iDPO and iSFT-DPO);
* :mod:`~optima_trainers.generation.rollouts`: resumable rollouts, readability and rewards;
* :mod:`~optima_trainers.generation.shards`: data-parallel generation, each rank its shard.
"""
