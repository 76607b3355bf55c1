"""The CTranslate2 backend: conversion cache, seeds, stops, and agreement with transformers.

Fast tests convert a tiny randomly initialized Llama (the embedded tokenizer) into a temporary
cache; the slow ones use the embedded SmolLM2-135M-Instruct (converted once into the user cache).
Every model runs on one thread (the machine is shared).
"""

from __future__ import annotations

import doctest
import json
import logging
import subprocess
import sys

import pytest

from optima_env.policy import GenerationRequest, SamplingParams, speaker_stops
from tests.helpers import REPO_ROOT
from tests.optima_env.backend_contract import chat_requests, check_contract


def test_without_ctranslate2_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ctranslate2'] = None\n"
        "import optima_env, optima_env.backends.ct2 as ct2, optima_env.backends.ct2_readability as r\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from optima_env.errors import MissingDependencyError\n"
        "for build in (ct2.CTranslate2Policy.from_pretrained, r.CTranslate2LMLoss.from_pretrained):\n"
        "    try:\n"
        "        build('embedded')\n"
        "    except MissingDependencyError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all("pip install 'optima[ct2]'" in line for line in lines), lines
    assert "'ctranslate2' is needed here" in lines[0]


ctranslate2 = pytest.importorskip("ctranslate2")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from optima_env.backends import ct2_convert  # noqa: E402
from optima_env.backends.ct2 import CTranslate2Policy  # noqa: E402
from optima_env.backends.ct2_readability import CTranslate2LMLoss  # noqa: E402
from optima_env.backends.hf import TransformersPolicy  # noqa: E402

pytestmark = pytest.mark.slow  # runs a real model: the full suite only

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


def make_tiny_model(folder, *, seed: int = 0):
    """The shared tiny random Llama, with untied embeddings as these tests were written with."""
    from tests.optima_trainers.tiny_model import make_tiny_model as build

    return build(folder, seed=seed, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ct2-cache")


@pytest.fixture(scope="module")
def tiny(tiny_folder, tiny_cache):
    return CTranslate2Policy.from_pretrained(
        str(tiny_folder), compute_type="float32", intra_threads=1, cache_root=tiny_cache
    )


def conversation(i: int, turns: int) -> GenerationRequest:
    system = f"You are Alice. Instance {i % 3}. " + "fact " * (4 + 9 * (i % 3))
    messages = [{"role": "system", "content": system}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"{'Bob' if t % 2 else 'Alice'}: turn {t} of {i}"})
    return GenerationRequest(messages=messages, prefix="Alice:", agent="Alice", key=(i, turns))


def test_a_checkpoint_is_converted_once_and_again_when_its_weights_change(
    tiny_folder, tmp_path, monkeypatch, caplog
) -> None:
    converted = []
    real = ct2_convert._convert
    monkeypatch.setattr(ct2_convert, "_convert", lambda *a: converted.append(a[0]) or real(*a))
    with caplog.at_level(logging.INFO, logger="optima_env.backends.ct2_convert"):
        first = ct2_convert.convert_model(str(tiny_folder), compute_type="int8", root=tmp_path)
        again = ct2_convert.convert_model(str(tiny_folder), compute_type="int8", root=tmp_path)
    assert first == again and len(converted) == 1
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("converted")]
    assert len(logged) == 1 and " to CTranslate2 int8 in " in logged[0], logged
    marker = json.loads((first / ".optima-complete").read_text())
    assert marker["compute_type"] == "int8" and marker["seconds"] > 0
    assert first.name.startswith(marker["sha256"][:24])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary folder was left"
    other = ct2_convert.convert_model(str(make_tiny_model(tmp_path / "other", seed=1)), root=tmp_path)
    assert other != first and len(converted) == 2
    assert ct2_convert.convert_model(str(tiny_folder), compute_type="float32", root=tmp_path) != first


def test_a_folder_without_weights_is_rejected(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no weight files"):
        ct2_convert.content_hash(tmp_path)
    with pytest.raises(ValueError, match="expected a model folder"):
        ct2_convert.source_folder(str(tmp_path / "missing"))


def test_contract_and_equality_with_transformers_on_a_tiny_model(tiny, tiny_folder) -> None:
    check_contract(tiny, chat_requests(5), max_new_tokens=6)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_folder).eval()
    reference = TransformersPolicy(model, tiny.tokenizer, fast=False, batch_size=3, precision="float32")
    requests = [conversation(i, i % 3) for i in range(7)]  # uneven prompt lengths
    assert tiny.generate(requests, GREEDY) == reference.generate(requests, GREEDY)


def test_stop_strings_cut_the_reply_and_end_the_row(tiny) -> None:
    request = conversation(1, 1)
    full = tiny.generate([request], SamplingParams(temperature=0, max_new_tokens=16))[0]
    continuation = full[len("Alice:") :]
    stop = continuation[6:9]
    assert stop.strip(), f"pick another stop string from {continuation!r}"
    tiny.stats.generated_tokens = 0
    stopped = tiny.generate([request], SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,)))
    assert stopped == ["Alice:" + continuation[: continuation.find(stop)]]
    assert tiny.stats.generated_tokens < 16  # the callback ended the row early


def test_stops_and_order_hold_across_length_groups(tiny) -> None:
    from optima_env.backends import ct2
    from optima_env.backends.hf import render_prompt
    from optima_env.policy import finish_reply

    assert doctest.testmod(ct2).failed == 0
    requests = [conversation(i, 4 * (i % 3)) for i in range(6)]  # three prompt lengths
    sampling = SamplingParams(temperature=0, max_new_tokens=16)
    tokenizer = tiny.tokenizer
    lengths = sorted(
        len(tokenizer(render_prompt(tokenizer, r), add_special_tokens=False).input_ids) for r in requests
    )
    assert len(ct2.length_groups(lengths, 16, tiny.batch_size, tiny.group_cost)) > 1
    full = tiny.generate(requests, sampling)
    stop = full[1][len("Alice:") :][6:9]
    assert stop.strip(), f"pick another stop string from {full[1]!r}"
    stopped = tiny.generate(requests, SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,)))
    assert stopped == [finish_reply("Alice:", f[len("Alice:") :], (stop,)) for f in full]
    assert stopped[1] != full[1]


def test_ignore_eos_generates_exactly_max_new_tokens(tiny) -> None:
    tiny.stats.generated_tokens = 0
    tiny.generate([conversation(i, 0) for i in range(3)], SamplingParams(max_new_tokens=9, ignore_eos=True))
    assert tiny.stats.generated_tokens == 27


def test_seeded_sampling_is_reproducible_for_the_same_requests(tiny, tiny_folder, tiny_cache) -> None:
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=10, seed=3)
    requests = [conversation(i, 1) for i in range(5)]
    first = tiny.generate(requests, sampling)
    assert tiny.generate(requests[::-1], sampling)[::-1] == first  # any order, a later call
    other = CTranslate2Policy.from_pretrained(
        str(tiny_folder), compute_type="float32", intra_threads=1, cache_root=tiny_cache
    )
    assert other.generate(requests, sampling) == first  # another policy
    assert tiny.generate(requests, SamplingParams(temperature=1.0, max_new_tokens=10, seed=4)) != first
    assert tiny.stats.reloads >= 2  # each seeded call after the first ran on fresh workers
    unseeded = CTranslate2Policy(tiny.model_dir, compute_type="float32", intra_threads=1, reseed=False)
    assert unseeded.generate(requests, sampling) == first
    assert unseeded.generate(requests, sampling) != first  # why: a worker's generator is seeded once


def test_bad_settings_are_refused(tiny) -> None:
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        CTranslate2Policy(tiny.model_dir, tiny.tokenizer, batch_size=0)
    with pytest.raises(RuntimeError, match="is not supported on 'cpu'"):
        CTranslate2Policy(tiny.model_dir, tiny.tokenizer, compute_type="float8")


def test_the_ct2_scorer_equals_the_transformers_scorer_on_a_tiny_model(tiny, tiny_folder) -> None:
    from optima_env.readability import TransformersLMLoss

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_folder).eval()
    texts = ["Alice: The capital of France is Paris.", "Bob: ok", "Alice:  zq xv " * 5]
    expected = TransformersLMLoss(model, tiny.tokenizer)(texts)
    got = CTranslate2LMLoss(tiny.model_dir, compute_type="float32", intra_threads=1, batch_size=2)(texts)
    assert got == pytest.approx(expected, abs=1e-4)


def test_the_ct2_scorer_is_registered_through_its_entry_point() -> None:
    from optima_env import get_plugin_manager
    from optima_env.registry import readability_specs

    specs = readability_specs(get_plugin_manager())
    assert {"transformers", "ct2"} <= set(specs)
    assert specs["ct2"].factory == CTranslate2LMLoss.from_pretrained


# -- the embedded model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded_f32():
    return CTranslate2Policy.from_pretrained("embedded", compute_type="float32", intra_threads=1)


@pytest.fixture(scope="module")
def embedded_int8():
    return CTranslate2Policy.from_pretrained("embedded", compute_type="int8", intra_threads=1)


def token_prefix(tokenizer, a: str, b: str) -> int:
    """How many leading tokens two replies share."""
    x, y = tokenizer(a)["input_ids"], tokenizer(b)["input_ids"]
    return next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), min(len(x), len(y)))


def test_float32_greedy_replies_equal_transformers(embedded, embedded_f32) -> None:
    model, tokenizer = embedded
    reference = TransformersPolicy(model, tokenizer, fast=False, precision="float32")
    requests = chat_requests(6)
    for sampling in (
        SamplingParams(temperature=0, max_new_tokens=48),
        SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True),
    ):
        expected = reference.generate(requests, sampling)
        got = embedded_f32.generate(requests, sampling)
        shared = [token_prefix(tokenizer, a, b) for a, b in zip(expected, got)]
        print(f"greedy agreement ({sampling.max_new_tokens} tokens): shared prefix tokens {shared}")
        assert got == expected


def test_int8_contract_and_speaker_stops_in_a_rollout(embedded_int8) -> None:
    from optima_env import make_task
    from optima_env.rollout import make_jobs, rollout

    check_contract(embedded_int8, chat_requests(4), max_new_tokens=16)
    tokenizer = embedded_int8.tokenizer
    episodes = rollout(
        make_task("ie/synth-v0"),
        embedded_int8,
        jobs=make_jobs(range(3), 2, seed=0),
        sampling=SamplingParams(temperature=0.7, max_new_tokens=32, seed=0),
        env_kwargs={"tokenizer": tokenizer, "max_turns": 4},
        concurrency=6,
        stop_at_speaker_tags=True,
    )
    assert len(episodes) == 6
    tags = speaker_stops(["Alice", "Bob"])
    for episode in episodes:
        for turn in episode.turns:
            assert turn.text.startswith(f"{turn.agent}:")
            assert not any(tag in turn.text[len(turn.agent) + 1 :] for tag in tags), turn.text
        assert episode.num_tokens == sum(len(tokenizer.tokenize(t.text)) for t in episode.turns)


def test_a_lora_checkpoint_answers_as_under_transformers(tmp_path) -> None:
    peft = pytest.importorskip("peft")
    from optima_env.models import load_model
    from optima_trainers.host.checkpoint import TrainResult, atomic_checkpoint
    from optima_trainers.sft.trainer import lora_config

    base, tokenizer = load_model("embedded")
    model = peft.get_peft_model(base, lora_config(r=8, alpha=16))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: lora_B starts at zero, so give it weights
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    merged = model.merge_and_unload().eval()
    with atomic_checkpoint(tmp_path / "checkpoint") as (tmp, finish):  # as the trainers save
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        finish(TrainResult(checkpoint=str(tmp_path / "checkpoint"), train_loss=1.0, steps=1, num_examples=1))

    requests = chat_requests(4)
    sampling = SamplingParams(temperature=0, max_new_tokens=32)
    reference = TransformersPolicy(merged, tokenizer, fast=False, precision="float32")
    expected = reference.generate(requests, sampling)
    cache = tmp_path / "ct2"
    for source in (adapter, tmp_path / "checkpoint"):
        policy = CTranslate2Policy.from_pretrained(
            str(source), compute_type="float32", intra_threads=1, cache_root=cache
        )
        assert policy.generate(requests, sampling) == expected, source.name
    base_policy = CTranslate2Policy.from_pretrained("embedded", compute_type="float32", intra_threads=1)
    assert base_policy.generate(requests, sampling) != expected, "the adapter changed nothing"


def test_readability_through_ct2_against_fp32_transformers(embedded, embedded_int8) -> None:
    """The measurement quoted in ``optima_env.backends.ct2_readability``'s docstring."""
    from optima_env import make_task
    from optima_env.readability import TransformersLMLoss
    from optima_env.rollout import make_jobs, rollout

    model, tokenizer = embedded
    episodes = rollout(
        make_task("ie/synth-v0"),
        embedded_int8,
        jobs=make_jobs(range(6), 2, seed=0),
        sampling=SamplingParams(temperature=0.7, max_new_tokens=48, seed=0),
        env_kwargs={"tokenizer": tokenizer, "max_turns": 4},
        concurrency=12,
    )
    turns = [t.text for e in episodes for t in e.turns]
    assert len(turns) >= 24
    expected = TransformersLMLoss(model, tokenizer)(turns)
    diffs = {}
    for compute_type in ("float32", "int8"):
        scorer = CTranslate2LMLoss.from_pretrained("embedded", compute_type=compute_type, intra_threads=1)
        got = scorer(turns)
        diffs[compute_type] = [abs(a - b) for a, b in zip(got, expected)]
        mean, worst = sum(diffs[compute_type]) / len(turns), max(diffs[compute_type])
        print(
            f"readability {compute_type}: {len(turns)} turns, mean |diff| {mean:.2e}, max |diff| {worst:.2e}"
        )
    assert max(diffs["float32"]) < 1e-3
    assert sum(diffs["int8"]) / len(turns) < 0.2
