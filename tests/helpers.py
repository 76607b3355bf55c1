"""Test helpers importable as ``tests.helpers``: a tiny inline task and its plugin, a scripted
policy whose backend fails, the one-error-line check of the CLI suites, and dataset fixtures in
the exact upstream schemas (written into a temporary data folder by the tests)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from optima_env import AgentView, BackendError, Task, TaskSample, TaskSpec, hookimpl
from optima_env.policy import ScriptedPolicy
from optima_env.scoring import extract_tagged, f1


class TinyTask(Task):
    """Two fixed instances; Alice knows the city, Bob the country; answers in <A></A>."""

    family = "information_exchange"

    def __init__(self, num_agents: int = 2) -> None:
        self.agents = ("Alice", "Bob", "Charlie")[:num_agents]
        self._samples = (
            TaskSample(id="tiny-0", question="Where does Ann live?", answers=("Paris",)),
            TaskSample(id="tiny-1", question="Where does Bo live?", answers=("Rome", "Roma")),
        )

    def samples(self, split: str) -> Sequence[TaskSample]:
        return self._samples

    def views(
        self, sample: TaskSample, *, rng: random.Random, format_index: int | None = None
    ) -> Mapping[str, AgentView]:
        return {
            a: AgentView(
                agent=a, system_prompt=f"You are {a}. {sample.question}", base_system_prompt=f"You are {a}."
            )
            for a in self.agents
        }

    def extract_answer(self, text: str) -> str | None:
        return extract_tagged(text, "A")

    def score(self, answer: str | None, sample: TaskSample) -> float:
        return f1(answer, sample.answers)


class TinyTaskPlugin:
    @hookimpl
    def optima_register_tasks(self) -> list[TaskSpec]:
        return [TaskSpec(id="test/tiny-v0", factory=TinyTask, family="information_exchange")]


REPO_ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


def returns(call: Callable[[], T], *, hang_s: float = 120.0) -> T:
    """``call()``'s value, failing the test if it has not returned after ``hang_s``.

    A hang guard, not a timing: the bound is far above any machine's time for a linear or
    time-limited call, so it fails only for a call that never returns (or is quadratic at the
    tests' sizes), however loaded the machine is.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(hang_s)
    assert not worker.is_alive(), f"the call did not return within {hang_s:.0f} s (it hangs)"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- dataset fixtures in the upstream schemas ------------------------------------------------------
class FailingAfter(ScriptedPolicy):
    """A scripted policy whose backend fails (as after its retries) from the ``fail_at``-th call on."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(lambda r: "<A>Paris</A>")
        self.fail_at = fail_at

    def generate(self, requests, sampling):
        if len(self.calls) + 1 >= self.fail_at:
            self.calls.append(len(requests))
            raise BackendError("server down after 5 attempts")
        return super().generate(requests, sampling)


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` for a child that a test interrupts with SIGINT: Ctrl-C acts on it as in a
    terminal, whatever this process inherited. A job started in the background by a
    non-interactive shell (``.ci/run ... &``) ignores SIGINT, its children inherit the ignore, and
    Python then installs no KeyboardInterrupt handler, so the child would run on to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``error:`` line of a command that failed on a user's mistake, checked to be the
    last line of its stderr, with exit status 2 and no traceback (every CLI's error suite)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and proc.stderr.rstrip().endswith(lines[0]), proc.stderr[-2000:]
    return lines[0]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


# Upstream 2WikiMultihopQA (original release dev.json: one JSON array).
TWOWIKI_DEV = [
    {
        "_id": "8813f87c0bdd11eba7f7acde48001122",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War (Film)?",
        "context": [
            [
                "Maheen Khan",
                [
                    "Maheen Khan is a Pakistani fashion and costume designer.",
                    " She is the founder of Maheen Khan Clothing Company.",
                ],
            ],
            [
                "Polish-Russian War (film)",
                [
                    "Polish-Russian War (Wojna polsko-ruska) is a 2009 Polish film directed by Xawery "
                    "Żuławski based on the novel Polish-Russian War under the white-red flag by Dorota "
                    "Masłowska."
                ],
            ],
            [
                "Xawery Żuławski",
                [
                    "Xawery Żuławski (born 22 December 1971 in Warsaw) is a Polish film director.",
                    " In 1995 he graduated National Film School in Łódź.",
                    " He is the son of actress Małgorzata Braunek and director Andrzej Żuławski.",
                ],
            ],
        ],
        "supporting_facts": [["Polish-Russian War (film)", 0], ["Xawery Żuławski", 2]],
        "evidences": [
            ["Polish-Russian War", "director", "Xawery Żuławski"],
            ["Xawery Żuławski", "mother", "Małgorzata Braunek"],
        ],
        "answer": "Małgorzata Braunek",
    },
    {
        "_id": "28b2b4bc0bdd11eba7f7acde48001122",
        "type": "comparison",
        "question": "Which film came out first, Blind Shaft or The Mask Of Fu Manchu?",
        "context": [
            [
                "The Mask of Fu Manchu",
                [
                    "The Mask of Fu Manchu is a 1932 pre-Code adventure film directed by Charles Brabin.",
                    " It was written by Irene Kuhn, Edgar Allan Woolf and John Willard.",
                ],
            ],
            [
                "Blind Shaft",
                [
                    "Blind Shaft is a 2003 film about a pair of brutal con artists "
                    "operating in the illegal coal mines of present-day northern China."
                ],
            ],
        ],
        "supporting_facts": [["Blind Shaft", 0], ["The Mask of Fu Manchu", 0], ["The Mask of Fu Manchu", 1]],
        "evidences": [
            ["Blind Shaft", "publication date", "2003"],
            ["The Mask of Fu Manchu", "publication date", "1932"],
        ],
        "answer": "The Mask Of Fu Manchu",
    },
]

# HF `trivia_qa`, config `rc` (search_results / entity_pages are column dicts).
TRIVIA_RC = [
    {
        "question": "Which Lloyd Webber musical premiered in the US on 10th December 1993?",
        "question_id": "tc_33",
        "question_source": "http://www.triviacountry.com/",
        "entity_pages": {
            "doc_source": ["TagMe"],
            "filename": ["Andrew_Lloyd_Webber.txt"],
            "title": ["Andrew Lloyd Webber"],
            "wiki_context": [""],
        },
        "search_results": {
            "description": [
                "Sunset Boulevard is a musical with music by Andrew Lloyd Webber, based on the "
                "1950 film of the same title.",
                "The musical opened in Los Angeles at the Shubert Theatre on 9 December 1993 "
                "before transferring to Broadway.",
            ],
            "filename": ["1/1.txt", "1/2.txt"],
            "rank": [0, 1],
            "title": ["Sunset Boulevard (musical) - Wikipedia", "Sunset Boulevard - Broadway"],
            "url": [
                "https://en.wikipedia.org/wiki/Sunset_Boulevard_(musical)",
                "https://www.ibdb.com/broadway-production/sunset-boulevard-4631",
            ],
            "search_context": ["", ""],
        },
        "answer": {
            "aliases": [
                "Sunset Blvd",
                "West Sunset Boulevard",
                "Sunset Boulevard",
                "Sunset Bulevard",
                "Sunset Blvd.",
            ],
            "normalized_aliases": [
                "sunset boulevard",
                "sunset blvd",
                "west sunset boulevard",
                "sunset bulevard",
            ],
            "matched_wiki_entity_name": "",
            "normalized_matched_wiki_entity_name": "",
            "normalized_value": "sunset boulevard",
            "type": "WikipediaEntity",
            "value": "Sunset Boulevard",
        },
    },
    {
        "question": "Who was the man behind The Chipmunks?",
        "question_id": "tc_40",
        "question_source": "http://www.triviacountry.com/",
        "entity_pages": {"doc_source": [], "filename": [], "title": [], "wiki_context": []},
        "search_results": {
            "description": [],
            "filename": [],
            "rank": [],
            "title": [],
            "url": [],
            "search_context": [],
        },
        "answer": {
            "aliases": ["David Seville"],
            "normalized_aliases": ["david seville"],
            "matched_wiki_entity_name": "",
            "normalized_matched_wiki_entity_name": "",
            "normalized_value": "david seville",
            "type": "WikipediaEntity",
            "value": "David Seville",
        },
    },
]

STORY = [
    "Once upon a time there lived in a wood a Rabbit who was very fond of carrots .",
    "Every morning he went down to the farmer 's garden to look at them .",
    "`` One day , '' said he , `` I shall eat them all . ''",
    "The farmer had a dog called Towser , who did not like rabbits at all .",
    "Towser slept by the gate with one eye open .",
    "The Rabbit knew this , and was careful to come only when the sun was high .",
    "One hot day the farmer went to market , and Towser went with him .",
    "`` Now is my chance , '' thought the Rabbit .",
    "He squeezed under the fence and began to dig .",
    "He pulled up one carrot , and then another , and then a third .",
    "But a Fox had been watching from behind the hedge .",
    "`` Good morning , friend Rabbit , '' said the Fox very politely .",
    "`` Those are fine carrots you have there . ''",
    "The Rabbit trembled , for he knew what foxes like for dinner .",
    "`` They are not mine , '' he said , `` they belong to the farmer . ''",
    "`` Then the farmer will not mind if we share them , '' said the Fox .",
    "Just then they heard the cart coming back along the road .",
    "Towser jumped down and ran barking into the garden .",
    "The Fox ran one way and the Rabbit ran the other .",
    "That night the Rabbit told his mother all about it .",
]
# HF `cbt`, config `CN`.
CBT_CN = [
    {
        "sentences": STORY,
        "question": "`` Never go into that garden again , '' said his XXXXX , `` or Towser will "
        "catch you . ''",
        "options": [
            "Fox",
            "Rabbit",
            "Towser",
            "carrot",
            "cart",
            "farmer",
            "garden",
            "hedge",
            "market",
            "mother",
        ],
        "answer": "mother",
    },
    {
        "sentences": [s.replace("Rabbit", "Hare") for s in STORY],
        "question": "The XXXXX ran one way and the Hare ran the other .",
        "options": [
            "Fox",
            "Hare",
            "Towser",
            "carrot",
            "cart",
            "farmer",
            "garden",
            "hedge",
            "market",
            "mother",
        ],
        "answer": "Fox",
    },
]

# HF `hotpot_qa`, config `distractor` (column dicts; one supporting-fact entry per sentence).
HOTPOT_HF = [
    {
        "id": "5a8b57f25542995d1e6f1371",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood", "Ed Wood"], "sent_id": [0, 0, 1]},
        "context": {
            "title": ["Ed Wood (film)", "Scott Derrickson", "Ed Wood", "Tyler Bates"],
            "sentences": [
                ["Ed Wood is a 1994 American biographical film.", " It stars Johnny Depp."],
                ["Scott Derrickson (born 1966) is an American director.", " He lives in Los Angeles."],
                ["Edward Davis Wood Jr. was an American filmmaker.", " He made low-budget films."],
                ["Tyler Bates is an American musician.", " He scores films."],
            ],
        },
    }
]
# openai/grade-school-math JSONL (HF `gsm8k`/`main` has the same fields).
GSM8K_ROWS = [
    {"question": "Tom has 3 bags of 4 apples. How many apples?", "answer": "3 * 4 = <<3*4=12>>12\n#### 12"},
    {"question": "How many dollars are 1,500 cents?", "answer": "1500 / 100 = <<1500/100=15>>15\n#### 15"},
]
# Hendrycks MATH (one problem per file upstream; HF `EleutherAI/hendrycks_math` rows).
MATH_ROWS = [
    {
        "problem": "What is $\\frac{2}{4}$ in lowest terms?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
    },
    {"problem": "Compute $3^2$.", "level": "Level 1", "type": "Algebra", "solution": "$3^2=\\boxed{9}$."},
]
# HF `ai2_arc`, config `ARC-Challenge` (the second row uses numeric labels, as some items do).
ARC_ROWS = [
    {
        "id": "Mercury_7175875",
        "question": "Which of these is a source of light?",
        "choices": {"text": ["a mirror", "the Sun", "the Moon", "a window"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
    {
        "id": "MCAS_2000_4_6",
        "question": "Which tool measures mass?",
        "choices": {"text": ["a ruler", "a balance", "a thermometer"], "label": ["1", "2", "3"]},
        "answerKey": "2",
    },
]
# HF `cais/mmlu` (answer = index into choices).
MMLU_ROWS = [
    {
        "question": "What is the chemical symbol of gold?",
        "subject": "high_school_chemistry",
        "choices": ["Ag", "Au", "Gd", "Go"],
        "answer": 1,
    }
]
FIXTURE_FILES = {
    "hotpotqa/dev.jsonl": HOTPOT_HF,
    "triviaqa/validation.jsonl": TRIVIA_RC,
    "cbt/test.jsonl": CBT_CN,
    "gsm8k/test.jsonl": GSM8K_ROWS,
    "math/test.jsonl": MATH_ROWS,
    "arc_challenge/test.jsonl": ARC_ROWS,
    "mmlu/test.jsonl": MMLU_ROWS,
}
"""The ``test`` split of every JSONL dataset (2WikiMultihopQA's ``dev.json`` is written apart)."""


def write_task_fixtures(root: Path) -> Path:
    """Write the ``test`` split of all eight datasets under ``root`` (a data folder); return it."""
    for relative, rows in FIXTURE_FILES.items():
        write_jsonl(root / relative, rows)
    (root / "2wikimultihopqa").mkdir(parents=True, exist_ok=True)
    (root / "2wikimultihopqa" / "dev.json").write_text(json.dumps(TWOWIKI_DEV, ensure_ascii=False), "utf-8")
    return root
