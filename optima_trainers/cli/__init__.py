"""The trainers' command lines (the top layer).

* :mod:`~optima_trainers.cli.train`: ``python -m optima_trainers.train`` (run or resume a run);
* :mod:`~optima_trainers.cli.export`: ``python -m optima_trainers.cli.export`` (a LoRA adapter).
"""
