"""``build_once``: the convert-once-atomically helper behind the embedded model."""

from __future__ import annotations

import threading

import pytest

from optima_env.models import COMPLETE_MARKER, build_once


def test_a_folder_is_built_once_and_a_failed_build_leaves_nothing(tmp_path) -> None:
    target = tmp_path / "model"
    calls = []

    def broken(tmp):
        (tmp / "weights").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(target, broken)
    assert not target.exists() and [p.name for p in tmp_path.iterdir()] == ["model.lock"]

    def build(tmp):
        calls.append(tmp)
        (tmp / "weights").write_text("w")
        return "done\n"

    threads = [threading.Thread(target=build_once, args=(target, build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # the others waited on the lock and found the folder
    assert (target / "weights").read_text() == "w" and (target / COMPLETE_MARKER).read_text() == "done\n"
    assert build_once(target, build) == target and len(calls) == 1


def test_a_folder_without_its_marker_is_rebuilt(tmp_path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale").write_text("x")
    build_once(target, lambda tmp: (tmp / "weights").write_text("w") and "ok")
    assert sorted(p.name for p in target.iterdir()) == [COMPLETE_MARKER, "weights"]


def test_the_context_length_comes_from_the_config_wherever_the_model_lives(tmp_path) -> None:
    """A local folder (a multimodal config's text part too), ``embedded``, and a hub id read from
    the Hugging Face cache in a fresh process (offline); a path without a config, or a hub id that
    cannot be read, has none (with a warning for the hub id)."""
    import json
    import os
    import subprocess
    import sys

    from optima_env.models import context_length

    pytest.importorskip("transformers")
    plain, multimodal, bare = tmp_path / "plain", tmp_path / "mm", tmp_path / "bare"
    configs = {plain: {"n_positions": 1024}, multimodal: {"text_config": {"max_position_embeddings": 4096}}}
    for folder, config in configs.items():
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    bare.mkdir()
    folders = (plain, multimodal, bare, tmp_path / "absent")
    assert [context_length(str(p)) for p in folders] == [1024, 4096, None, None]
    assert context_length("embedded") == 8192  # SmolLM2-135M-Instruct's max_position_embeddings

    import transformers

    cache = tmp_path / "hub"
    snapshot = cache / "models--org--llama" / "snapshots" / ("0" * 40)
    transformers.LlamaConfig(max_position_embeddings=131072).save_pretrained(snapshot)
    (cache / "models--org--llama" / "refs").mkdir()
    (cache / "models--org--llama" / "refs" / "main").write_text("0" * 40, encoding="utf-8")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    code = "from optima_env.models import context_length as c; print(c('org/llama'), c('org/absent'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["131072", "None"]
    assert "cannot read the config of 'org/absent'" in done.stderr
