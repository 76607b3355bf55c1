"""The MCTS-style turn tree of iDPO (spec §6); the host's tree stages are
:mod:`optima_trainers.generation.tree_stage`.

* :mod:`~optima_trainers.tree.nodes`: the tree and its nodes;
* :mod:`~optima_trainers.tree.search`: ``build_trees``, selection and expansion;
* :mod:`~optima_trainers.tree.scheduler`: every tree expands on its own in one rollout loop;
* :mod:`~optima_trainers.tree.normalizer`: the token normalizer (spec §6.3).
"""
