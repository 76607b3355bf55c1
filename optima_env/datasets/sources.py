"""Where a dataset split comes from: the local files and the Hugging Face hub copy of each split.

:data:`DATASETS` maps each dataset id to a :class:`DatasetSpec`: its row converter and, per split,
the candidate local files under ``<data_dir>/<dataset>/`` (first existing wins) and the hub copy.
``test`` is always the evaluation split of spec §8.1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from optima_env.datasets.debate import arc_sample, gsm8k_sample, math_sample, mmlu_sample
from optima_env.datasets.files import RowRef
from optima_env.datasets.qa import cbt_sample, hotpotqa_sample, triviaqa_sample, twowiki_sample
from optima_env.errors import DataError
from optima_env.types import TaskSample

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "FileChoice",
    "HubSource",
    "SplitSpec",
    "choice_name",
    "get_spec",
    "parse_hub_name",
]

Converter = Callable[..., TaskSample]
"""``convert(row, ref: RowRef, default_id: str, **options) -> TaskSample``."""


@dataclass(frozen=True, slots=True)
class HubSource:
    """A Hugging Face hub dataset split; several configs are read and concatenated in order."""

    name: str
    configs: tuple[str | None, ...]
    split: str

    def describe(self) -> str:
        """``name:config[,config...] [split]``, as messages show it."""
        configs = ",".join(c for c in self.configs if c)
        return f"{self.name}{':' + configs if configs else ''} [{self.split}]"

    def ref(self, config: str | None, row: int) -> RowRef:
        """The :class:`RowRef` of the ``row``-th (1-based) row of ``config``."""
        return RowRef(f"hub {self.name}{':' + config if config else ''} [{self.split}]", row, "row")


FileChoice = str | tuple[str, ...]
"""One candidate of a split: a file name, or a group of files read together as one split."""


def choice_name(choice: FileChoice) -> str:
    """A candidate as messages show it: ``dev.json`` or ``a.jsonl + b.jsonl`` (a group)."""
    return choice if isinstance(choice, str) else " + ".join(choice)


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """One split: candidate local files (first existing wins) and its hub copy, if any.

    A candidate is a file name or a tuple of names, a *group*: used when every file of it exists,
    and read as one split (the files in order, their union de-duplicated by question, the first
    occurrence kept; :func:`~optima_env.datasets.loading.load_samples_with_report` counts the
    rows left out). ``missing`` says, when no candidate exists and there is no hub copy, how to
    provide the split (it replaces the dataset's generic :attr:`DatasetSpec.no_hub` advice).
    """

    files: tuple[FileChoice, ...]
    hub: HubSource | None
    missing: str = ""


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """One dataset: its id, row converter and splits.

    ``context_option`` marks converters that take ``require_context`` (the datasets whose local
    copies may lack contexts). ``no_hub`` explains, for datasets without a hub copy, what to pass.
    """

    name: str
    convert: Converter
    splits: Mapping[str, SplitSpec]
    context_option: bool = False
    no_hub: str = ""

    def split(self, split: str) -> SplitSpec:
        """The :class:`SplitSpec` of ``split``; raises :class:`DataError` listing the valid ones."""
        try:
            return self.splits[split]
        except KeyError:
            raise DataError(
                f"unknown split {split!r} for dataset {self.name!r}; valid splits: {', '.join(self.splits)}"
            ) from None


def _hub(name: str, configs: str | tuple[str | None, ...] | None, split: str) -> HubSource:
    return HubSource(name, configs if isinstance(configs, tuple) else (configs,), split)


def _splits(**splits: SplitSpec) -> Mapping[str, SplitSpec]:
    return MappingProxyType(dict(splits))


TWOWIKI_DEV_CONTEXTS = ("dev_200_context.jsonl", "dev_ircot_paragraphs.jsonl")
"""The local 2WikiMultihopQA dev copy with contexts: 200 official dev rows with sentence-level
supporting facts, then IRCoT's 600 dev rows with paragraph-level support (read as one split; the
sentence-level row wins for the questions in both)."""
TWOWIKI_NO_TRAIN = (
    "no 2WikiMultihopQA train split is provided (the local copy holds dev questions only); take "
    "train.json from the original release (github.com/Alab-NII/2wikimultihop, the data linked from "
    "its README: train.json, dev.json, test.json) and put it in <data_dir>/2wikimultihopqa/, where "
    "the 'train' split finds it, or pass the task argument hf_name=<a folder holding train.json "
    'and dev.json> (trainers: --set \'task_kwargs={"hf_name": "/path/to/folder"}\'); a file '
    "path given as hf_name is read for every split, evaluation included"
)
"""How to provide 2WikiMultihopQA ``train`` (the error when it is missing)."""

_HOTPOT = "hotpotqa/hotpot_qa"  # formerly `hotpot_qa`
_TRIVIA = ("mandarjoshi/trivia_qa", "rc.nocontext")  # `trivia_qa`/`rc` rows without page texts
_CBT = ("cam-cst/cbt", "CN")
_GSM8K = ("openai/gsm8k", "main")
_MATH = "EleutherAI/hendrycks_math"
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
_ARC = ("allenai/ai2_arc", "ARC-Challenge")
_MMLU = ("cais/mmlu", "all")


# size: the dataset table: one declarative entry per dataset, read top to bottom
def _build() -> Mapping[str, DatasetSpec]:
    hotpot_eval = SplitSpec(("dev.jsonl", "validation.jsonl"), _hub(_HOTPOT, "distractor", "validation"))
    wiki_dev = SplitSpec(("dev.json", "dev.jsonl", TWOWIKI_DEV_CONTEXTS, "dev_qa_only.jsonl"), None)
    trivia_eval = SplitSpec(("validation.jsonl", "test_qa_only.jsonl"), _hub(*_TRIVIA, "validation"))
    mmlu = {
        s: SplitSpec((f"{s}.jsonl",), _hub(*_MMLU, s))
        for s in ("test", "validation", "dev", "auxiliary_train")
    }
    specs = [
        DatasetSpec(
            "hotpotqa",
            hotpotqa_sample,
            _splits(
                train=SplitSpec(("train.jsonl",), _hub(_HOTPOT, "distractor", "train")),
                test=hotpot_eval,
                dev=hotpot_eval,
                validation=hotpot_eval,
            ),
        ),
        DatasetSpec(
            "2wikimultihopqa",
            twowiki_sample,
            _splits(
                train=SplitSpec(("train.json", "train.jsonl"), None, missing=TWOWIKI_NO_TRAIN),
                test=wiki_dev,
                dev=wiki_dev,
            ),
            context_option=True,
            no_hub="2WikiMultihopQA has no Hugging Face hub copy: put the original release "
            "(dev.json / train.json) in <data_dir>/2wikimultihopqa/ or pass hf_name=<path to the "
            "file or its folder>",
        ),
        DatasetSpec(
            "triviaqa",
            triviaqa_sample,
            _splits(
                train=SplitSpec(("train.jsonl",), _hub(*_TRIVIA, "train")),
                test=trivia_eval,
                validation=SplitSpec(("validation.jsonl",), _hub(*_TRIVIA, "validation")),
            ),
            context_option=True,
        ),
        DatasetSpec(
            "cbt",
            cbt_sample,
            _splits(
                **{s: SplitSpec((f"{s}.jsonl",), _hub(*_CBT, s)) for s in ("train", "test", "validation")}
            ),
        ),
        DatasetSpec(
            "gsm8k",
            gsm8k_sample,
            _splits(**{s: SplitSpec((f"{s}.jsonl",), _hub(*_GSM8K, s)) for s in ("train", "test")}),
        ),
        DatasetSpec(
            "math",
            math_sample,
            _splits(
                train=SplitSpec(("train.jsonl",), _hub(_MATH, MATH_SUBJECTS, "train")),
                test=SplitSpec(("test.jsonl",), _hub(_MATH, MATH_SUBJECTS, "test")),
                math500=SplitSpec(("math500_test.jsonl",), _hub("HuggingFaceH4/MATH-500", None, "test")),
            ),
        ),
        DatasetSpec(
            "arc_challenge",
            arc_sample,
            _splits(
                **{s: SplitSpec((f"{s}.jsonl",), _hub(*_ARC, s)) for s in ("train", "test", "validation")}
            ),
        ),
        DatasetSpec(
            "mmlu",
            mmlu_sample,
            _splits(
                train=mmlu["auxiliary_train"],
                test=mmlu["test"],
                validation=mmlu["validation"],
                dev=mmlu["dev"],
                auxiliary_train=mmlu["auxiliary_train"],
            ),
        ),
    ]
    return MappingProxyType({spec.name: spec for spec in sorted(specs, key=lambda s: s.name)})


DATASETS: Mapping[str, DatasetSpec] = _build()
"""Every dataset id and its :class:`DatasetSpec`, sorted by id."""


def get_spec(dataset: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``dataset``; raises :class:`DataError` listing the valid ids."""
    try:
        return DATASETS[dataset]
    except (KeyError, TypeError):
        raise DataError(f"unknown dataset {dataset!r}; valid datasets: {', '.join(DATASETS)}") from None


def parse_hub_name(hf_name: str, default: HubSource) -> HubSource:
    """Override ``default``'s hub name by ``hf_name``: ``name`` keeps the default config(s),
    ``name:config[,config...]`` sets them, ``name:`` means no config.
    """
    name, sep, configs = hf_name.partition(":")
    if not name:
        raise DataError(f"hf_name {hf_name!r} has no dataset name before ':'")
    if not sep:
        return HubSource(name, default.configs, default.split)
    parsed: tuple[Any, ...] = tuple(c.strip() for c in configs.split(",") if c.strip()) or (None,)
    return HubSource(name, parsed, default.split)
