"""``build_once``: the convert-once-atomically helper behind the embedded model and CTranslate2's cache."""

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
