"""Tests of optima_env.datasets: real data (OPTIMA_DATA_DIR), upstream-schema fixtures, bad files.

The real-data tests read ``OPTIMA_DATA_DIR`` and are skipped when it is unset. Fixtures are written
by the tests into ``tmp_path`` in the exact upstream layouts (2WikiMultihopQA ``dev.json``, HF
``trivia_qa`` rc, HF ``cbt`` CN, HF ``hotpot_qa`` / ``gsm8k`` / MATH) and read through the same API.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from optima_env.datasets import (
    ARC_OVERLAP,
    LoadReport,
    last_boxed_content,
    list_datasets,
    list_splits,
    load_samples,
    load_samples_with_report,
    read_jsonl,
    require_field,
    resolve_data_dir,
)
from optima_env.errors import DataError
from optima_env.types import Paragraph
from tests.helpers import CBT_CN, STORY, TRIVIA_RC, TWOWIKI_DEV, write_jsonl

ALL_DATASETS = [
    "2wikimultihopqa",
    "arc_challenge",
    "cbt",
    "gsm8k",
    "hotpotqa",
    "math",
    "mmlu",
    "triviaqa",
]


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture
def real_data() -> Path:
    """The benchmark data folder named by OPTIMA_DATA_DIR (skip when unset)."""
    value = os.environ.get("OPTIMA_DATA_DIR")
    if not value:
        pytest.skip("OPTIMA_DATA_DIR is not set: point it at the benchmark data to run this test")
    return Path(value)


@pytest.fixture
def no_env_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTIMA_DATA_DIR", raising=False)


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make any Hugging Face hub access fail at once (offline mode, empty caches)."""
    cache = tmp_path / "hf-cache"
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(cache),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "HF_HUB_CACHE": str(cache / "hub"),
    }.items():
        monkeypatch.setenv(name, value)
    patches = {
        "huggingface_hub.constants": {"HF_HUB_OFFLINE": True, "HF_HUB_CACHE": str(cache / "hub")},
        "datasets.config": {
            "HF_HUB_OFFLINE": True,
            "HF_DATASETS_OFFLINE": True,
            "HF_DATASETS_CACHE": cache / "datasets",
        },
    }
    for module_name, attrs in patches.items():
        module = sys.modules.get(module_name)  # already imported: env changes come too late
        for attr, value in attrs.items():
            if module is not None and hasattr(module, attr):
                monkeypatch.setattr(module, attr, value)


# -- 1. the real data (OPTIMA_DATA_DIR) ------------------------------------------------------------
@pytest.mark.data
def test_hotpotqa_train_first_rows(real_data: Path) -> None:
    samples = load_samples("hotpotqa", "train", limit=3)  # reads OPTIMA_DATA_DIR itself
    first = samples[0]
    assert len(samples) == 3
    assert first.id == "5ab4435b5542990594ba9bdf"
    assert first.answers == ("romance",)
    assert len(first.context) == 10 and all(isinstance(p, Paragraph) for p in first.context)
    assert first.context[0].title == "Corinne Jorry"
    assert first.context[0].sentences[0].startswith("Corinne Jorry (born 23 April 1943)")
    assert first.supporting_titles == ("Danilo Donati", "Romeo and Juliet (1968 film)")
    assert first.metadata["sf_granularity"] == "sentence"
    assert not first.options


@pytest.mark.data
def test_hotpotqa_test_is_dev_and_keeps_one_title_per_supporting_sentence(real_data: Path) -> None:
    samples, report = load_samples_with_report("hotpotqa", "test", data_dir=real_data)
    assert report.origin.endswith("dev.jsonl") and len(samples) == report.samples == 687
    # row 2 has sentence-level facts (Jonny Craig 0, 2; Pete Doherty 1, 2): duplicates kept
    assert samples[1].supporting_titles == ("Jonny Craig", "Jonny Craig", "Pete Doherty", "Pete Doherty")
    paragraph_rows = [s for s in samples if s.metadata["sf_granularity"] == "paragraph"]
    assert len(paragraph_rows) == 487
    assert all(len(set(s.supporting_titles)) == len(s.supporting_titles) >= 2 for s in paragraph_rows)


@pytest.mark.data
def test_gsm8k_math_math500_first_rows(real_data: Path) -> None:
    gsm = load_samples("gsm8k", "test", limit=2)
    assert gsm[0].id == "gsm8k-test-0" and gsm[0].answers == ("18",)
    assert gsm[0].question.startswith("Janet’s ducks lay 16 eggs")
    assert gsm[0].metadata["solution"].endswith("#### 18")
    assert load_samples("gsm8k", "train", limit=1)[0].answers == ("72",)
    math = load_samples("math", "test", limit=2)
    assert math[0].id == "test/algebra/1.json" and math[0].answers == ("2",)
    assert math[0].metadata["level"] == "Level 3" and math[0].metadata["subject"] == "Algebra"
    assert "\\boxed{2}" in math[0].metadata["solution"]
    m500 = load_samples("math", "math500")
    assert len(m500) == 500
    assert m500[0].answers == ("\\left( 3, \\frac{\\pi}{2} \\right)",)
    assert m500[0].metadata["subject"] == "Precalculus" and m500[0].metadata["level"] == 2


@pytest.mark.data
def test_arc_and_mmlu_test_first_rows(real_data: Path) -> None:
    arc = load_samples("arc_challenge", "test", limit=1)[0]
    assert arc.id == "Mercury_7175875"
    assert arc.answers == ("Planetary days will become shorter.",)
    assert arc.options[2] == arc.answer and len(arc.options) == 4
    assert arc.question.endswith("increase in rotation?")  # raw: no "choose your answer" suffix
    assert arc.metadata == {"labels": ["A", "B", "C", "D"], "answer_key": "C"}
    mmlu = load_samples("mmlu", "test", limit=1)[0]
    assert mmlu.id == "abstract_algebra-test-0"
    assert mmlu.options == ("0", "4", "2", "6") and mmlu.answers == ("4",)
    assert mmlu.metadata["subject"] == "abstract_algebra"


@pytest.mark.data
def test_mmlu_train_drops_arc_questions_and_shuffles(real_data: Path) -> None:
    samples, report = load_samples_with_report("mmlu", "train", data_dir=real_data)
    assert isinstance(report, LoadReport)
    assert report.rows_read == 10_407
    assert report.dropped == {ARC_OVERLAP: 174}
    assert len(samples) == report.samples == 10_233
    arc_questions = {s.question.strip() for s in load_samples("arc_challenge", "train")}
    assert not any(s.question.strip() in arc_questions for s in samples)
    raw = load_samples("mmlu", "auxiliary_train", data_dir=real_data)
    assert [s.id for s in samples] != [s.id for s in raw if s.question.strip() not in arc_questions]
    head = load_samples("mmlu", "train", data_dir=real_data, limit=5)
    assert [s.id for s in head] == [s.id for s in samples[:5]]  # seed 42: same order every time


@pytest.mark.data
def test_question_only_copies_need_opt_in(real_data: Path) -> None:
    # 2Wiki's question-only copy is the last candidate (the copy with contexts wins), so it is read
    # only when named, or when it is the only file of the folder
    wiki = real_data / "2wikimultihopqa" / "dev_qa_only.jsonl"
    assert load_samples("2wikimultihopqa", "test", limit=1)[0].context  # the contexts' copy wins
    with pytest.raises(
        DataError,
        match=rf"{re.escape(str(wiki))}, line 1: field 'context': "
        r"null: .*original 2WikiMultihopQA release",
    ):
        load_samples("2wikimultihopqa", "test", hf_name=str(wiki))
    closed = load_samples("2wikimultihopqa", "test", hf_name=str(wiki), require_context=False, limit=2)
    assert closed[1].answers == ("Mask of Fu Manchu", "The Mask of Fu Manchu")
    assert closed[1].context == () and closed[1].supporting_titles == ()
    trivia = real_data / "triviaqa" / "test_qa_only.jsonl"
    with pytest.raises(
        DataError,
        match=rf"{re.escape(str(trivia))}, line 1: field "
        r"'search_results': null",
    ):
        load_samples("triviaqa", "test")
    sample = load_samples("triviaqa", "test", require_context=False, limit=1)[0]
    assert sample.answers[0] == "Mark Twain" and "Samuel Clemens" in sample.answers


# -- 2. upstream-schema fixtures -------------------------------------------------------------------
def test_twowiki_original_release(tmp_path: Path) -> None:
    dev = tmp_path / "2wikimultihopqa" / "dev.json"
    dev.parent.mkdir()
    dev.write_text(json.dumps(TWOWIKI_DEV, ensure_ascii=False, indent=1), "utf-8")
    write_jsonl(
        dev.parent / "dev_qa_only.jsonl", [{"id": "x", "question": "q", "answer": "a", "context": None}]
    )
    samples = load_samples("2wikimultihopqa", "test", data_dir=tmp_path)  # dev.json wins
    first, second = samples
    assert first.id == "8813f87c0bdd11eba7f7acde48001122"
    assert first.answers == ("Małgorzata Braunek",)
    assert [p.title for p in first.context] == ["Maheen Khan", "Polish-Russian War (film)", "Xawery Żuławski"]
    assert first.context[2].sentences[2].endswith("Andrzej Żuławski.")
    assert first.supporting_titles == ("Polish-Russian War (film)", "Xawery Żuławski")
    assert first.metadata["type"] == "compositional" and len(first.metadata["evidences"]) == 2
    assert second.supporting_titles == (
        "Blind Shaft",
        "The Mask of Fu Manchu",
        "The Mask of Fu Manchu",
    )  # one per fact, listed order
    by_path = load_samples("2wikimultihopqa", "dev", hf_name=str(dev), source="hf")
    assert by_path == samples


def test_triviaqa_rc_schema(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "triviaqa" / "validation.jsonl", TRIVIA_RC)
    first, second = load_samples("triviaqa", "test", data_dir=tmp_path)
    assert first.id == "tc_33"
    assert first.answers == (
        "Sunset Boulevard",
        "Sunset Blvd",
        "West Sunset Boulevard",
        "Sunset Bulevard",
        "Sunset Blvd.",
    )
    assert first.context == (
        Paragraph(
            title="Sunset Boulevard (musical) - Wikipedia",
            sentences=(TRIVIA_RC[0]["search_results"]["description"][0],),
        ),
        Paragraph(
            title="Sunset Boulevard - Broadway", sentences=(TRIVIA_RC[0]["search_results"]["description"][1],)
        ),
    )
    assert second.context == () and second.answers == ("David Seville",)


def test_cbt_cn_schema(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "cbt" / "test.jsonl", CBT_CN)
    first, second = load_samples("cbt", "test", data_dir=tmp_path)
    assert first.id == "cbt-test-1" and second.id == "cbt-test-2"
    assert len(first.context) == 20
    assert first.context[0] == Paragraph(title="", sentences=(STORY[0],))
    assert first.question == CBT_CN[0]["question"]  # raw: the options suffix is the task's
    assert first.options == tuple(CBT_CN[0]["options"]) and first.answers == ("mother",)
    assert second.answers == ("Fox",)


def test_hotpotqa_hf_and_original_layouts(tmp_path: Path) -> None:
    hf_row = {  # HF hotpot_qa/distractor: column dicts
        "id": "5a8b57f25542995d1e6f1371",
        "type": "comparison",
        "level": "hard",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes",
        "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood", "Ed Wood"], "sent_id": [0, 0, 1]},
        "context": {
            "title": ["Ed Wood", "Scott Derrickson"],
            "sentences": [
                ["Edward Davis Wood Jr. was an American filmmaker.", " He was known for low-budget films."],
                ["Scott Derrickson is an American director."],
            ],
        },
    }
    original_row = {  # original JSON: pairs
        "_id": "5a8c7595554299585d9e36b6",
        "type": "bridge",
        "level": "medium",
        "question": "Who wrote the book the film was based on?",
        "answer": "Roald Dahl",
        "supporting_facts": [["Matilda (film)", 0], ["Matilda (novel)", 0]],
        "context": [
            ["Matilda (film)", ["Matilda is a 1996 film based on the novel."]],
            ["Matilda (novel)", ["Matilda is a 1988 novel by Roald Dahl."]],
        ],
    }
    write_jsonl(tmp_path / "hotpotqa" / "validation.jsonl", [hf_row, original_row])
    hf, original = load_samples("hotpotqa", "test", data_dir=tmp_path)
    assert hf.supporting_titles == ("Scott Derrickson", "Ed Wood", "Ed Wood")
    assert hf.context[0] == Paragraph(title="Ed Wood", sentences=tuple(hf_row["context"]["sentences"][0]))
    assert original.id == "5a8c7595554299585d9e36b6"
    assert original.supporting_titles == ("Matilda (film)", "Matilda (novel)")


def test_gsm8k_and_math_hf_schema(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "gsm8k" / "test.jsonl",
        [{"question": "A farm sells 1080 eggs...", "answer": "It sells 1,080.\n#### 1,080"}],
    )
    assert load_samples("gsm8k", "test", data_dir=tmp_path)[0].answers == ("1080",)
    write_jsonl(
        tmp_path / "math" / "test.jsonl",
        [
            {
                "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
                "level": "Level 1",
                "type": "Algebra",
                "solution": "We get $\\boxed{\\frac{3}{4}}$, not \\fbox{x}; so $\\boxed{\\frac{3}{4}}$.",
            }
        ],
    )
    sample = load_samples("math", "test", data_dir=tmp_path)[0]
    assert sample.answers == ("\\frac{3}{4}",) and sample.id == "math-test-1"
    assert last_boxed_content("\\boxed{a}\\fbox{{b}}") == "{b}"
    assert last_boxed_content("$\\boxed 5$") == "5" and last_boxed_content("\\boxed{1") is None


def test_mmlu_filter_on_fixture_and_opt_out(tmp_path: Path) -> None:
    aux = [
        {"question": f"Question {i}?", "choices": ["a", "b", "c", "d"], "answer": i % 4, "subject": ""}
        for i in range(6)
    ]
    write_jsonl(tmp_path / "mmlu" / "auxiliary_train.jsonl", aux)
    with pytest.raises(DataError, match=r"needs ARC-Challenge train.*filter_arc=False"):
        load_samples("mmlu", "train", data_dir=tmp_path, source="local")
    assert len(load_samples("mmlu", "train", data_dir=tmp_path, filter_arc=False)) == 6
    write_jsonl(
        tmp_path / "arc_challenge" / "train.jsonl",
        [
            {
                "id": "arc-1",
                "question": " Question 2? ",
                "answerKey": "A",
                "choices": {"text": ["x", "y"], "label": ["A", "B"]},
            }
        ],
    )
    samples, report = load_samples_with_report("mmlu", "train", data_dir=tmp_path)
    assert report.dropped == {ARC_OVERLAP: 1} and len(samples) == 5
    assert sorted(s.id for s in samples) == sorted(f"mmlu-auxiliary_train-{i}" for i in (1, 2, 4, 5, 6))


def test_hub_path_concatenates_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub branch, with `datasets.load_dataset` (the network boundary) serving local rows."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name: str, config: str | None, split: str) -> Any:
        calls.append((name, config, split))
        solution = "$\\boxed{1}$" if config != "geometry" else "no box here"
        return datasets.Dataset.from_list(
            [{"problem": f"{config} problem", "level": "Level 2", "type": str(config), "solution": solution}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples, report = load_samples_with_report("math", "train", source="hf", limit=2)
    assert [s.id for s in samples] == ["math-train-1", "math-train-2"]
    assert samples[1].metadata["subject"] == "counting_and_probability"
    assert report.origin.startswith("hub EleutherAI/hendrycks_math:algebra,counting")
    assert len(calls) == 7 and calls[0] == ("EleutherAI/hendrycks_math", "algebra", "train")
    with pytest.raises(
        DataError,
        match=r"hub EleutherAI/hendrycks_math:geometry \[test\], row 1: "
        r"field 'solution': no balanced",
    ):
        load_samples("math", "test", source="hf")
    calls.clear()
    assert len(load_samples("math", "test", source="hf", hf_name="someone/math-mirror:")) == 1
    assert calls == [("someone/math-mirror", None, "test")]


# -- 3. malformed data -----------------------------------------------------------------------------
GOOD_GSM = {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}


def _gsm_file(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "gsm8k" / "test.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _where(path: Path, line: int) -> str:
    return rf"{re.escape(str(path))}, line {line}"


def test_truncated_line(tmp_path: Path) -> None:
    path = _gsm_file(tmp_path, (json.dumps(GOOD_GSM) + "\n" + '{"question": "Q", "ans').encode())
    with pytest.raises(DataError, match=_where(path, 2) + r": invalid JSON.*truncated"):
        load_samples("gsm8k", "test", data_dir=tmp_path)


def test_missing_field(tmp_path: Path) -> None:
    path = _gsm_file(tmp_path, b'\n{"answer": "#### 4"}\n')  # blank line 1 still counts
    with pytest.raises(DataError, match=_where(path, 2) + r": field 'question': missing"):
        load_samples("gsm8k", "test", data_dir=tmp_path)


def test_wrong_types(tmp_path: Path) -> None:
    arc = write_jsonl(
        tmp_path / "arc_challenge" / "test.jsonl",
        [{"id": "a", "question": "Q?", "choices": "A) x B) y", "answerKey": "A"}],
    )
    with pytest.raises(DataError, match=_where(arc, 1) + r": field 'choices': expected dict, got str"):
        load_samples("arc_challenge", "test", data_dir=tmp_path)
    mmlu = write_jsonl(
        tmp_path / "mmlu" / "test.jsonl",
        [
            {"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": 1},
            {"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": "B"},
        ],
    )
    with pytest.raises(DataError, match=_where(mmlu, 2) + r": field 'answer': expected int, got str"):
        load_samples("mmlu", "test", data_dir=tmp_path)
    hotpot = write_jsonl(
        tmp_path / "hotpotqa" / "dev.jsonl",
        [
            {
                "question": "Q?",
                "answer": "a",
                "supporting_facts": [["T", 0]],
                "context": [["T", "one sentence, not a list"]],
            }
        ],
    )
    with pytest.raises(DataError, match=_where(hotpot, 1) + r": field 'context\[0\]': expected list"):
        load_samples("hotpotqa", "test", data_dir=tmp_path)


def test_answer_key_not_a_label(tmp_path: Path) -> None:
    arc = write_jsonl(
        tmp_path / "arc_challenge" / "test.jsonl",
        [
            {
                "id": "a",
                "question": "Q?",
                "choices": {"text": ["x", "y"], "label": ["A", "B"]},
                "answerKey": "E",
            }
        ],
    )
    with pytest.raises(DataError, match=_where(arc, 1) + r": field 'answerKey': 'E' is not one"):
        load_samples("arc_challenge", "test", data_dir=tmp_path)


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    path = _gsm_file(tmp_path, content)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: no rows"):
        load_samples("gsm8k", "test", data_dir=tmp_path)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    good = json.dumps(GOOD_GSM).encode()
    path = _gsm_file(tmp_path, good + b"\n" + good + b"\n" + b'{"question": "caf\xe9?"}\n')
    with pytest.raises(DataError, match=_where(path, 3) + r": bytes that are not UTF-8"):
        load_samples("gsm8k", "test", data_dir=tmp_path)


def test_read_jsonl_and_require_field(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"a": [2]}\n[3]\n')
    rows = read_jsonl(path)
    assert next(rows) == (1, {"a": 1}) and next(rows) == (3, {"a": [2]})
    with pytest.raises(DataError, match=_where(path, 4) + r": expected a JSON object, got list"):
        next(rows)
    with pytest.raises(DataError, match=r"f\.jsonl, line 7: field 'a': expected list, got int"):
        require_field({"a": 1}, "a", list, path="f.jsonl", line=7)
    with pytest.raises(DataError, match=r"field 'b': missing; the row has fields \['a'\]"):
        require_field({"a": 1}, "b", str, path="f.jsonl", line=7)
    assert require_field({"a": None}, "a", str, path="f", line=1, nullable=True) is None


# -- 4. neither local data nor hub -----------------------------------------------------------------
@pytest.mark.usefixtures("offline_hub", "no_env_data_dir")
def test_no_local_and_no_hub_names_both_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dialed: list[object] = []

    def connect(sock: socket.socket, address: object) -> None:
        dialed.append(address)
        raise OSError("the test forbids network access")

    monkeypatch.setattr(socket.socket, "connect", connect)
    for data_dir in (None, tmp_path):
        with pytest.raises(DataError) as info:
            load_samples("cbt", "test", data_dir=data_dir)
        message = str(info.value)
        assert "set --data-dir / OPTIMA_DATA_DIR to a folder with cbt/test.jsonl" in message
        assert "install `optima[train]` and allow network access to load cam-cst/cbt:CN" in message
    assert dialed == []  # offline: the hub is not even tried, so nothing retries against it
    with pytest.raises(DataError, match=r"hub: not tried \(source='local'\).*optima\[train\]"):
        load_samples("gsm8k", "test", data_dir=tmp_path, source="local")
    with pytest.raises(DataError, match=r"no Hugging Face hub copy.*hf_name"):
        load_samples("2wikimultihopqa", "test", source="hf")


def test_data_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTIMA_DATA_DIR", raising=False)
    assert resolve_data_dir() is None
    assert resolve_data_dir(tmp_path) == tmp_path
    monkeypatch.setenv("OPTIMA_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    with pytest.raises(DataError, match=r"does not exist"):
        resolve_data_dir(tmp_path / "missing")
    monkeypatch.setenv("OPTIMA_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(DataError, match=r"nope.*from OPTIMA_DATA_DIR.*does not exist"):
        load_samples("gsm8k", "test")


# -- 5. unknown names ------------------------------------------------------------------------------
def test_unknown_dataset_and_split_list_valid_names() -> None:
    assert list_datasets() == ALL_DATASETS
    with pytest.raises(
        DataError, match=r"unknown dataset 'hotpot'; valid datasets: " + re.escape(", ".join(ALL_DATASETS))
    ):
        load_samples("hotpot", "test")
    with pytest.raises(
        DataError,
        match=r"unknown split 'eval' for dataset 'math'; valid splits: "
        r"train, test, math500",
    ):
        load_samples("math", "eval")
    for dataset in ALL_DATASETS:
        assert {"train", "test"} <= set(list_splits(dataset))
    with pytest.raises(DataError, match=r"unknown source 'web'"):
        load_samples("gsm8k", "test", source="web")  # type: ignore[arg-type]
