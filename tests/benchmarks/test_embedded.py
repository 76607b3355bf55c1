"""The smoke suite with the real embedded model (a tiny budget): real generation, real token counts."""

from __future__ import annotations

import pytest

from optima_env.io import read_episodes


@pytest.mark.slow
def test_smoke_suite_plays_the_embedded_model_and_counts_with_its_tokenizer(bench, embedded) -> None:
    _, tokenizer = embedded
    results, out = bench("--suite", "smoke", "--episodes", "1", "--max-new-tokens", "8", "--max-turns", "2")
    episodes = read_episodes(out / "episodes.jsonl")
    assert sorted(e.metadata["method"] for e in episodes) == ["cot", "mad"]
    for episode in episodes:
        assert episode.num_tokens == sum(len(tokenizer.tokenize(t.text)) for t in episode.turns) > 0
    cot, mad = sorted(episodes, key=lambda e: e.metadata["method"])
    assert len(cot.turns) == 1 and not cot.turns[0].text.startswith("Alice:")
    assert [t.agent for t in mad.turns][:2] == ["Alice", "Bob"][: len(mad.turns)]
    assert all(t.text.startswith(f"{t.agent}:") for t in mad.turns)
    assert results["model"] == "embedded" and "tokenizer" in results["token_counter"]
    assert {r["method"]: r["mean_tokens"] for r in results["rows"]} == {
        "CoT": float(cot.num_tokens),
        "MAD": float(mad.num_tokens),
    }
