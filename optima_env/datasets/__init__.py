"""Dataset loading: one converter per dataset, local JSONL or the Hugging Face hub.

>>> from optima_env.datasets import list_datasets
>>> list_datasets()
['2wikimultihopqa', 'arc_challenge', 'cbt', 'gsm8k', 'hotpotqa', 'math', 'mmlu', 'triviaqa']

Typical use: ``load_samples("hotpotqa", "test", data_dir=..., limit=1000)``. Local data lives in
``<data_dir>/<dataset>/<file>.jsonl`` (``data_dir`` defaults to ``$OPTIMA_DATA_DIR``); without it,
the hub copy is read through the optional ``datasets`` package (extra ``optima[train]``).
"""

from __future__ import annotations

from optima_env.datasets.debate import (
    arc_sample,
    gsm8k_sample,
    last_boxed_content,
    math_sample,
    mmlu_sample,
)
from optima_env.datasets.files import (
    DATA_DIR_ENV,
    RowRef,
    read_jsonl,
    read_records,
    require_field,
    resolve_data_dir,
)
from optima_env.datasets.loading import (
    ARC_OVERLAP,
    DUPLICATE_QUESTION,
    MMLU_SHUFFLE_SEED,
    LoadReport,
    Source,
    list_datasets,
    list_splits,
    load_samples,
    load_samples_with_report,
)
from optima_env.datasets.qa import cbt_sample, hotpotqa_sample, triviaqa_sample, twowiki_sample
from optima_env.datasets.sources import DATASETS, DatasetSpec, HubSource, SplitSpec

__all__ = [
    "ARC_OVERLAP",
    "DATASETS",
    "DATA_DIR_ENV",
    "DUPLICATE_QUESTION",
    "MMLU_SHUFFLE_SEED",
    "DatasetSpec",
    "HubSource",
    "LoadReport",
    "RowRef",
    "Source",
    "SplitSpec",
    "arc_sample",
    "cbt_sample",
    "gsm8k_sample",
    "hotpotqa_sample",
    "last_boxed_content",
    "list_datasets",
    "list_splits",
    "load_samples",
    "load_samples_with_report",
    "math_sample",
    "mmlu_sample",
    "read_jsonl",
    "read_records",
    "require_field",
    "resolve_data_dir",
    "triviaqa_sample",
    "twowiki_sample",
]
