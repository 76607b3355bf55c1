"""The host loop, the top of the trainer's layers.

* :mod:`~optima_trainers.host.loop`: generate → score → select → deliver → train → next model.
"""
