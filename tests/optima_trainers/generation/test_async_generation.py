"""The trainer's rollouts under the asynchronous driver: ``generation.driver`` and
``generation.concurrency`` reach every rollout of a tree stage, the trees of a stage grow in one
search with each tree saved the moment it is complete (no chunk drain), and a stage killed after
one tree resumes by tree. Also the settings' validation and each rank's GPU for its vLLM engine.

The policy is scripted (the env and the stage's files are what is tested) and a real
:class:`~optima_env.policy.TurnEngine`: it answers one request per ``poll``, oldest first, and the
trees' conversations have uneven lengths (tree 0's run to the turn cap, the others' end at their
second turn), so the trees complete out of tree order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path

import pytest

from optima_env.errors import ConfigError
from optima_env.policy import GenerationRequest, SamplingParams, ScriptedPolicy, TurnEngine
from optima_env.rollout import job_seed
from optima_trainers.config.env import EnvSettings
from optima_trainers.config.sections import GenerationConfig
from optima_trainers.config.train import resolve_config
from optima_trainers.generation.engines import rank_gpus
from tests.helpers import REPO_ROOT

TREE_POSITIONS = [1, 2, 3]
LONG_TREE = job_seed(0, TREE_POSITIONS[0], 0)  # tree 0's seed: every rollout of it shares it


class UnevenEngine:
    """A scripted turn engine: ``poll`` answers the oldest submitted request only; tree 0's turns
    never answer (its conversations run to the turn cap), every other conversation answers at once
    (and ends by agreement at its second turn). Counts its calls and records the sessions asked."""

    capacity = 6

    def __init__(self) -> None:
        self.script = ScriptedPolicy(self.reply)
        self.queue: deque[tuple[int, GenerationRequest, SamplingParams]] = deque()
        self.calls: Counter[str] = Counter()
        self.sessions: set[int] = set()

    def reply(self, request: GenerationRequest) -> str:
        self.sessions.add(request.session[0])
        return "still thinking about it" if request.session[0] == LONG_TREE else "<A>x</A>"

    def generate(self, requests, sampling):
        self.calls["generate"] += 1
        return self.script.generate(requests, sampling)

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        self.calls["submit"] += 1
        self.queue.append((ticket, request, sampling))

    def poll(self) -> list[tuple[int, str]]:
        self.calls["poll"] += 1
        ticket, request, sampling = self.queue.popleft()
        return [(ticket, self.script.generate([request], sampling)[0])]


def run_stage(folder: Path, *, sampled: bool = False, **overrides) -> UnevenEngine:
    """Generate (or resume) a 3-tree stage of ie/synth-v0 into ``folder`` with :class:`UnevenEngine`
    (``sampled``: a sampled stage of 2 instances x 2 conversations instead), its phases and times
    recorded in a real run state beside it (``<folder>-run/state.json``)."""
    import time

    from optima_task_synth import SyntheticChainTask

    from optima_trainers.generation.rollouts import GenerationContext
    from optima_trainers.generation.samples import generate_sample_stage
    from optima_trainers.generation.tree_stage import generate_tree_stage
    from optima_trainers.run.folder import RunDir
    from optima_trainers.run.stages import Stage

    task = SyntheticChainTask(train_size=4)
    task.bind("ie/synth-v0")
    sizes = {"generation.max_turns": 4, "tree.instances": 3, "tree.normalizer_instances": 1,
             "tree.selections": 2, "tree.rollouts": 2, "tree.theta_filter": -100.0, "tree.theta_diff": 0.0,
             "generation.num_samples": 2, "reward.short_trajectory_tokens": None, **overrides}  # fmt: skip
    config = resolve_config("ie/synth-v0", "idpo", overrides=sizes)
    policy = UnevenEngine()
    assert isinstance(policy, TurnEngine)

    class Events:
        def optima_episode_scored(self, **kwargs) -> None:
            pass

        def optima_select_training_data(self, episodes, **kwargs):
            return episodes

    run = RunDir(folder.parent / f"{folder.name}-run")
    run.root.mkdir(exist_ok=True)
    ctx = GenerationContext(
        task=task, config=config, stage=Stage(name="iter_01", kind="dpo", number=1, generate="tree"),
        folder=folder, seed=0, num_train=4, load_policy=lambda: policy, release=lambda p: None,
        env=lambda p, diverse=False: EnvSettings(scoring=False), readability=lambda: (lambda texts: [2.0] * len(texts)),
        events=Events(), phase=lambda phase, started, extra: run.record_phase(
            "iter_01", phase, time.perf_counter() - started, **extra),
        record_time=lambda phase, seconds: run.record_time("iter_01", phase, seconds),
    )  # fmt: skip
    if sampled:
        generate_sample_stage(ctx, indices=TREE_POSITIONS[1:], init=False)
    else:
        generate_tree_stage(ctx, normalizer_indices=[0], tree_positions=TREE_POSITIONS)
    return policy


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_driver_reaches_every_rollout_of_a_tree_stage(tmp_path: Path) -> None:
    turns = run_stage(tmp_path / "auto")  # auto: the policy's own turn engine
    assert (
        turns.calls["submit"] > 0
        and turns.calls["poll"] == turns.calls["submit"]
        and turns.calls["generate"] == 0
    )
    batch = run_stage(tmp_path / "batch", **{"generation.driver": "batch"})  # one generate per step
    assert batch.calls["generate"] > 0 and batch.calls["submit"] == batch.calls["poll"] == 0
    # the same data either way, the trees in tree order in the stage's file
    for name in ("normalizer.jsonl", "trees.jsonl", "pairs.jsonl", "pairs_detail.jsonl"):
        assert (tmp_path / "auto" / name).read_bytes() == (tmp_path / "batch" / name).read_bytes(), name
    assert [r["chunk"] for r in lines(tmp_path / "auto" / "trees.jsonl")] == [0, 1, 2]
    assert all(len(r["trees"]) == 1 for r in lines(tmp_path / "auto" / "trees.jsonl"))


def test_driver_reaches_the_rollouts_of_a_sampled_stage(tmp_path: Path) -> None:
    turns = run_stage(tmp_path / "auto", sampled=True, **{"generation.driver": "turns"})
    assert turns.calls["submit"] == turns.calls["poll"] > 0 and turns.calls["generate"] == 0
    batch = run_stage(tmp_path / "batch", sampled=True, **{"generation.driver": "batch"})
    assert batch.calls["generate"] > 0 and batch.calls["submit"] == 0
    for name in ("episodes.jsonl", "scored.jsonl", "selected.jsonl"):
        assert (tmp_path / "auto" / name).read_bytes() == (tmp_path / "batch" / name).read_bytes(), name
    assert len(lines(tmp_path / "auto" / "episodes.jsonl")) == 4


def test_each_tree_is_saved_as_it_completes_and_a_killed_stage_resumes_by_tree(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    run_stage(clean)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    env = {**os.environ, "OPTIMA_FAULT": "mcts_tree:1"}  # SIGKILL right after the first tree is appended
    done = subprocess.run(
        [sys.executable, "-m", "tests.optima_trainers.generation.test_async_generation", str(crashed)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr[-3000:]
    saved = lines(crashed / "trees.jsonl")
    # the first tree to complete was saved while tree 0 (long conversations) was still growing
    assert len(saved) == 1 and saved[0]["chunk"] == 1 and not (crashed / "pairs.jsonl").exists()
    assert saved[0] == lines(clean / "trees.jsonl")[1]
    # the saved tree's time is in the run state, the phase not marked finished (the normalizer is)
    killed = json.loads((tmp_path / "crashed-run" / "state.json").read_text(encoding="utf-8"))
    assert killed["phase"] == "normalizer" and killed["timings"]["iter_01"]["mcts"] > 0

    resumed = run_stage(crashed)  # no fault: the rest of the stage
    state = json.loads((tmp_path / "crashed-run" / "state.json").read_text(encoding="utf-8"))
    assert state["phase"] == "mcts"
    assert state["timings"]["iter_01"]["mcts"] > killed["timings"]["iter_01"]["mcts"]
    finished_seed = job_seed(0, TREE_POSITIONS[1], 0)
    assert finished_seed not in resumed.sessions  # the saved tree was not grown again
    assert {LONG_TREE, job_seed(0, TREE_POSITIONS[2], 0)} <= resumed.sessions
    for name in ("normalizer.jsonl", "trees.jsonl", "pairs.jsonl", "pairs_detail.jsonl"):
        assert (crashed / name).read_bytes() == (clean / name).read_bytes(), name


def test_generation_settings_are_validated() -> None:
    config = resolve_config("ie/synth-v0", "idpo", overrides={"generation.concurrency": "none"})
    assert config.generation.concurrency is None and config.generation.driver == "auto"
    assert resolve_config("ie/synth-v0", "idpo", profile="paper").generation.batch_size == 64
    with pytest.raises(ConfigError, match=r"generation\.driver.*'auto', 'batch', 'turns'.*'fast'"):
        resolve_config("ie/synth-v0", "idpo", overrides={"generation.driver": "fast"})
    with pytest.raises(
        ConfigError, match=r"generation\.driver must be one of auto, batch, turns, got 'fast'"
    ):
        GenerationConfig(driver="fast")
    for name in ("concurrency", "batch_size", "vllm_max_num_seqs"):
        with pytest.raises(ConfigError, match=rf"generation\.{name} must be an int >= 1, got 0"):
            GenerationConfig(**{name: 0})
    vllm = GenerationConfig(backend="vllm", vllm_max_num_seqs=8)
    assert vllm.policy_options()["max_num_seqs"] == 8
    assert "max_num_seqs" not in GenerationConfig(backend="vllm").policy_options()


def test_conversations_in_flight_come_from_the_engine_unless_set() -> None:
    from optima_trainers.generation.rollouts import in_flight

    script = ScriptedPolicy(lambda r: "hi")  # declares no capacity: its batch size
    assert in_flight(GenerationConfig(batch_size=7), script) == 7
    assert in_flight(GenerationConfig(batch_size=7), UnevenEngine()) is None  # rollout asks .capacity
    assert in_flight(GenerationConfig(batch_size=7, concurrency=3), UnevenEngine()) == 3


def test_each_rank_gets_its_own_gpus_for_its_vllm_engine() -> None:
    two = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert [rank_gpus({**two, "LOCAL_RANK": r}, 2) for r in ("0", "1")] == ["0", "1"]
    visible = {**two, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [rank_gpus({**visible, "LOCAL_RANK": r}, 4, 2) for r in ("0", "1")] == ["4,5", "6,7"]
    assert rank_gpus({**two, "LOCAL_RANK": "1"}, 1) is None  # two ranks on one GPU: shared, not narrowed
    assert rank_gpus({"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, 8) is None  # one process: untouched
    assert rank_gpus({"WORLD_SIZE": "2"}, 2) is None  # no LOCAL_RANK: untouched


if __name__ == "__main__":  # the killed child of the resume test
    run_stage(Path(sys.argv[1]))
