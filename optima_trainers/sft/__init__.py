"""SFT stages.

* :mod:`~optima_trainers.sft.selection`: iSFT data selection (spec §5, §13 items 1-2);
* :mod:`~optima_trainers.sft.data`: examples with a loss mask on the viewing agent's turns;
* :mod:`~optima_trainers.sft.trainer`: SFT on TRL's ``SFTTrainer`` (LoRA or full fine-tuning).
"""
