"""The trainers' command lines.

* :mod:`~optima_trainers.cli.train`: ``python -m optima_trainers.train`` (run or resume a run);
* :mod:`~optima_trainers.cli.export`: ``python -m optima_trainers.cli.export`` (a LoRA adapter);
* :mod:`~optima_trainers.cli.lora_svd`: the export's SVD of a weight change into LoRA factors.
"""
