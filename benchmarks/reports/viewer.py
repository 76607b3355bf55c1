"""A static, self-contained HTML page to read a run's conversations and their reward breakdowns.

Everything taken from an episode (model output, prompts, answers, ids) goes through
:func:`html.escape`, so a model that writes ``<script>`` shows it as text. No JavaScript; sections
fold with ``<details>``.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.reports.report import unread_cell
from optima_env.types import Episode

__all__ = ["render_viewer"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; max-width: 70em; }
details { margin: 0.3em 0; } summary { cursor: pointer; }
.turn { border-left: 3px solid #8aa; margin: 0.4em 0; padding: 0.2em 0.6em; background: #f7f9f9; }
.turn pre, .prompt pre { white-space: pre-wrap; margin: 0.2em 0; font-size: 0.9em; }
table.rb { border-collapse: collapse; font-size: 0.9em; } table.rb td, table.rb th { border: 1px solid #ccc;
 padding: 0.1em 0.5em; }
.meta { color: #555; font-size: 0.9em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _breakdown(episode: Episode) -> str:
    rb = episode.reward
    if rb is None:
        return "<p class='meta'>no reward breakdown</p>"
    fields = [
        ("task", rb.task),
        ("token", rb.token),
        ("readability", rb.readability),
        ("total", rb.total),
        ("#tokens", rb.num_tokens),
        ("normalizer", rb.normalizer),
        ("LM loss", rb.lm_loss),
        ("flags", ", ".join(rb.flags) or "–"),
    ]
    head = "".join(f"<th>{_e(k)}</th>" for k, _ in fields)
    cells = "".join(f"<td>{_e(_fmt(v))}</td>" for _, v in fields)
    return f"<table class='rb'><tr>{head}</tr><tr>{cells}</tr></table>"


def _episode(episode: Episode) -> str:
    meta = episode.metadata
    summary = (
        f"instance {_e(meta.get('instance'))} · sample {_e(meta.get('sample'))} · "
        f"{_e(episode.sample_id)} · score {_e(_fmt(episode.task_score))} · "
        f"{_e(episode.num_tokens)} tokens · {_e(episode.end_reason)}"
    )
    prompts = "".join(
        f"<details class='prompt'><summary>system prompt of {_e(agent)}</summary>"
        f"<pre>{_e(text)}</pre></details>"
        for agent, text in episode.system_prompts.items()
    )
    turns = "".join(
        f"<div class='turn'><b>{_e(t.agent)}</b> <span class='meta'>({_e(t.num_tokens)} tokens"
        f"{', answer: ' + _e(t.answer) if t.answer is not None else ''})</span><pre>{_e(t.text)}</pre></div>"
        for t in episode.turns
    )
    answer = "(none)" if episode.final_answer is None else episode.final_answer
    return (
        f"<details><summary>{summary}</summary>"
        f"<p class='meta'>final answer: <b>{_e(answer)}</b> · gold: {_e(' | '.join(episode.gold))}</p>"
        f"{_breakdown(episode)}{prompts}{turns}</details>"
    )


def render_viewer(title: str, sections: Sequence[tuple[Mapping[str, Any], Sequence[Episode]]]) -> str:
    """The page: one section per (task, method) results row with the episodes to show.

    Args:
        title: the page title (the run name).
        sections: ``(row, episodes)`` pairs; ``row`` is a results row (task, method, score,
            mean_tokens, episodes, instances), ``episodes`` what to show of it.
    """
    body = [f"<h1>{_e(title)}</h1>"]
    for row, episodes in sections:
        score = "–" if row.get("score") is None else f"{row['score']:.3f}"
        tokens = "–" if row.get("mean_tokens") is None else f"{row['mean_tokens']:.1f}"
        shown = len({e.metadata.get("instance") for e in episodes})
        note = (
            f" (showing {shown} of {row.get('instances')} instances)"
            if shown < row.get("instances", 0)
            else ""
        )
        body.append(
            f"<h2>{_e(row['task'])} · {_e(row['method'])}</h2>"
            f"<p class='meta'>score {_e(score)} · mean #tokens {_e(tokens)} · "
            f"{_e(row.get('episodes'))} episodes{_e(note)} · unread answers {_e(unread_cell(row))}</p>"
        )
        body.extend(_episode(e) for e in episodes)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
