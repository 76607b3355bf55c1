"""2WikiMultihopQA on the real local dev copy (``$OPTIMA_DATA_DIR/2wikimultihopqa/``).

The loader reads ``dev_200_context.jsonl`` (sentence-level facts) and ``dev_ircot_paragraphs.jsonl``
(paragraph-level support) as one split; the dealing, the alias scoring, the missing train split and
the conformance suite (PettingZoo's api, seed and parallel tests inside ``check_task``) run on
those rows, not on fixtures. Skipped without ``OPTIMA_DATA_DIR``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from optima_env import DataError, make_task
from optima_env.datasets import DUPLICATE_QUESTION, load_samples, load_samples_with_report
from optima_env.testing import check_task
from optima_env.types import TaskSample

pytestmark = [
    pytest.mark.data,
    pytest.mark.filterwarnings(
        "ignore:.*(probably should be gymnasium|recommend agents to be named).*:UserWarning"
    ),
]

TASK = "ie/2wikimultihopqa-v0"
SENTENCE_FILE = "dev_200_context.jsonl"
PARAGRAPH_FILE = "dev_ircot_paragraphs.jsonl"


@pytest.fixture(scope="module")
def wiki_dir(data_dir: Path) -> Path:
    folder = data_dir / "2wikimultihopqa"
    if not (folder / SENTENCE_FILE).is_file() or not (folder / PARAGRAPH_FILE).is_file():
        pytest.skip(f"{folder} lacks {SENTENCE_FILE} / {PARAGRAPH_FILE}")
    return folder


def _questions(path: Path) -> list[str]:
    lines = path.read_text("utf-8").splitlines()
    return [json.loads(line)["question"].strip() for line in lines if line.strip()]


def _by_id(samples: list[TaskSample] | tuple[TaskSample, ...], sample_id: str) -> TaskSample:
    return next(s for s in samples if s.id == sample_id)


def _units(task, sample: TaskSample, seed: int) -> dict[str, tuple[str, ...]]:
    views = task.views(sample, rng=random.Random(seed))
    return {agent: views[agent].private for agent in task.agents}


# -- the loader ------------------------------------------------------------------------------------
def test_loader_reads_the_union_of_both_files_sentence_rows_first(wiki_dir: Path) -> None:
    sentence_qs, paragraph_qs = _questions(wiki_dir / SENTENCE_FILE), _questions(wiki_dir / PARAGRAPH_FILE)
    shared = set(sentence_qs) & set(paragraph_qs)
    samples, report = load_samples_with_report("2wikimultihopqa", "test", data_dir=wiki_dir.parent)
    assert len(sentence_qs) == 200 and len(paragraph_qs) == 600 and len(shared) == 9  # SOURCE.md
    assert len(samples) == report.samples == 791 == 200 + 600 - len(shared)
    assert report.rows_read == 800 and report.dropped == {DUPLICATE_QUESTION: 9}
    assert report.origin == f"{wiki_dir / SENTENCE_FILE} + {wiki_dir / PARAGRAPH_FILE}"
    assert [s.id for s in samples[:200]] == [f"dev_{i}" for i in range(200)]  # official dev order
    assert len({s.question for s in samples}) == 791
    granularity = [s.metadata["sf_granularity"] for s in samples]
    assert granularity == ["sentence"] * 200 + ["paragraph"] * 591
    kept = {s.question.strip(): s for s in samples}
    assert {kept[q].metadata["sf_granularity"] for q in shared} == {"sentence"}  # the sentence row wins
    assert load_samples("2wikimultihopqa", "dev", data_dir=wiki_dir.parent, limit=3) == samples[:3]


# -- dealing ---------------------------------------------------------------------------------------
def test_dev_0_deals_one_gold_paragraph_to_each_agent(wiki_dir: Path) -> None:
    task = make_task(TASK, data_dir=wiki_dir.parent, source="local")
    sample = task.samples("test")[0]
    assert sample.id == "dev_0" and sample.answers == ("Małgorzata Braunek",)
    assert sample.supporting_titles == ("Polish-Russian War (film)", "Xawery Żuławski")
    text = {p.title: p.text for p in sample.context}
    film, director = text["Polish-Russian War (film)"], text["Xawery Żuławski"]
    assert "directed by Xawery Żuławski" in film and director.startswith("Xawery Żuławski")
    distractors = [p.text for p in sample.context if p.title not in sample.supporting_titles]
    for seed in range(20):
        hands = _units(task, sample, seed)
        assert hands["Alice"][0] == film and hands["Bob"][0] == director  # listed order: even, odd
        assert director not in hands["Alice"] and film not in hands["Bob"]
        assert sorted(hands["Alice"][1:] + hands["Bob"][1:]) == sorted(distractors)  # each once
    alice_counts = {len(_units(task, sample, seed)["Alice"]) for seed in range(20)}
    assert len(alice_counts) > 1  # the distractors are dealt at random, seed by seed


def test_paragraph_level_rows_deal_each_gold_paragraph_once_in_context_order(wiki_dir: Path) -> None:
    sentence_task = make_task(TASK, data_dir=wiki_dir.parent, source="local")
    official = _by_id(sentence_task.samples("test"), "dev_19")
    ircot_task = make_task(TASK, hf_name=str(wiki_dir / PARAGRAPH_FILE))
    ircot = next(s for s in ircot_task.samples("test") if s.question == official.question)
    assert ircot.metadata["sf_granularity"] == "paragraph"
    assert all(len(p.sentences) == 1 for p in ircot.context)
    gold = ("Tangled Destinies", "The Daltons' Women", "Frank R. Strayer", "Thomas Carr (director)")
    assert official.supporting_titles == gold  # the facts' order: film, film, director, director
    assert set(ircot.supporting_titles) == set(gold)
    in_context_order = tuple(p.title for p in ircot.context if p.title in gold)
    assert ircot.supporting_titles == in_context_order
    for task, sample in ((sentence_task, official), (ircot_task, ircot)):
        text = {p.title: p.text for p in sample.context}
        hands = _units(task, sample, 0)
        titles = sample.supporting_titles
        assert hands["Alice"][:2] == (text[titles[0]], text[titles[2]])
        assert hands["Bob"][:2] == (text[titles[1]], text[titles[3]])
    alice_official = {official.supporting_titles[i] for i in (0, 2)}
    alice_ircot = {ircot.supporting_titles[i] for i in (0, 2)}
    assert alice_official == {"Tangled Destinies", "Frank R. Strayer"}  # a film and its director
    assert alice_ircot == {"Frank R. Strayer", "Thomas Carr (director)"}  # both directors
    strict = make_task(TASK, hf_name=str(wiki_dir / PARAGRAPH_FILE), strict_split=True)
    assert _units(strict, ircot, 3) == _units(ircot_task, ircot, 3)  # no duplicates to remove
    first_only = make_task(TASK, hf_name=str(wiki_dir / PARAGRAPH_FILE), full_paragraphs=False)
    assert _units(first_only, ircot, 3) == _units(ircot_task, ircot, 3)  # one "sentence" each


# -- scoring ---------------------------------------------------------------------------------------
def test_dev_88_scores_the_best_alias(wiki_dir: Path) -> None:
    task = make_task(TASK, data_dir=wiki_dir.parent, source="local")
    sample = _by_id(task.samples("test"), "dev_88")
    assert sample.metadata["sf_granularity"] == "sentence"  # IRCoT's copy (answer "Madrid") lost
    assert sample.answer == "City of Madrid" and "Madrid" in sample.answers
    assert task.score("Madrid", sample) == 1.0 == task.score("City of Madrid", sample)
    assert task.score("Barcelona", sample) == 0.0
    without_aliases = TaskSample(id="x", question=sample.question, answers=("City of Madrid",))
    assert 0.0 < task.score("Madrid", without_aliases) < 1.0  # the alias is what gives full credit


# -- the missing train split ------------------------------------------------------------------------
def test_train_split_is_missing_with_a_clear_error(wiki_dir: Path) -> None:
    task = make_task(TASK, data_dir=wiki_dir.parent, source="local")
    with pytest.raises(DataError) as info:
        task.samples("train")
    message = str(info.value)
    assert f"no train.json / train.jsonl in {str(wiki_dir)!r}" in message
    assert "no 2WikiMultihopQA train split is provided" in message
    assert "github.com/Alab-NII/2wikimultihop" in message and "<data_dir>/2wikimultihopqa/" in message
    assert '--set \'task_kwargs={"hf_name": "/path/to/folder"}\'' in message


def test_a_trainer_asking_for_train_gets_one_line(
    wiki_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from optima_trainers.cli.train import main

    monkeypatch.setenv("OPTIMA_DATA_DIR", str(wiki_dir.parent))  # --data-dir sets it; restored after

    argv = ["--task", "2wikimultihopqa", "--trainer", "isft", "--data-dir", str(wiki_dir.parent)]
    assert main([*argv, "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err  # one error line (after any log lines)
    assert "no 2WikiMultihopQA train split is provided" in errors[0] and "train.json" in errors[0]


# -- conformance on the real rows -------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ["sentence", "paragraph"])
def test_check_task_and_pettingzoo_suites_on_real_rows(wiki_dir: Path, granularity: str) -> None:
    kwargs = (
        {"data_dir": str(wiki_dir.parent), "source": "local"}
        if granularity == "sentence"
        else {"hf_name": str(wiki_dir / PARAGRAPH_FILE)}
    )
    task = make_task(TASK, **kwargs)
    assert {s.metadata["sf_granularity"] for s in task.samples("test")[:3]} == {granularity}
    report = check_task(task, api_cycles=10)
    assert report.samples_checked == 3 and report.formats_checked == 11
    assert {"evidence", "episode_seed", "api_test"} <= set(report.checks)


# -- the benchmark suite that plays the baselines report ---------------------------------------------
def test_the_baselines_suite_plays_the_demos_hotpotqa_baselines_settings() -> None:
    from benchmarks.demo.tasks import DEMO_TASKS, eval_settings
    from benchmarks.suites import get_suite

    suite, hotpot = get_suite("baselines"), next(t for t in DEMO_TASKS if t.name == "hotpotqa")
    settings = eval_settings(hotpot)
    assert suite.tasks == ((TASK,),) and suite.methods == hotpot.baselines == ("cot", "sc", "mad", "autoform")
    assert suite.instances == hotpot.eval_instances == 100 and suite.adapters == ()
    assert (suite.max_turns, suite.max_new_tokens, suite.sc_n) == (
        settings.max_turns,
        settings.max_new_tokens,
        settings.sc_n,
    )
    assert suite.stop_at_speaker_tags is settings.stop_at_speaker_tags is True
    assert suite.task_kwargs[TASK] == hotpot.task_kwargs == {"style": "small"}
