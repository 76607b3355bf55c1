"""Row converters for the information-exchange datasets: HotpotQA, 2WikiMultihopQA, TriviaQA, CBT.

Each converter takes one record (the local normalized JSONL schema of ``<data_dir>/<dataset>/`` or
the upstream / Hugging Face schema), its :class:`~optima_env.datasets.files.RowRef` and a default
id, and returns a :class:`~optima_env.types.TaskSample`. Questions are kept raw: suffixes such as
CBT's "choose your answer from ..." are added by the task plugins, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optima_env.datasets.common import sample_id, str_list, unique
from optima_env.datasets.files import RowRef
from optima_env.types import Paragraph, TaskSample

__all__ = ["cbt_sample", "hotpotqa_sample", "triviaqa_sample", "twowiki_sample"]


def _paragraphs(value: Any, ref: RowRef, field: str) -> tuple[Paragraph, ...]:
    """Titled paragraphs from any of the three layouts found in the wild.

    * Hugging Face columns: ``{"title": [t, ...], "sentences": [[s, ...], ...]}``;
    * original JSON pairs: ``[[title, [s, ...]], ...]``;
    * normalized records: ``[{"title": t, "sentences": [s, ...]}, ...]``.
    """
    if isinstance(value, dict):
        titles = str_list(value.get("title"), ref, f"{field}.title")
        sentences = ref.check(value.get("sentences"), list, f"{field}.sentences")
        if len(titles) != len(sentences):
            raise ref.error(f"{len(titles)} titles but {len(sentences)} sentence lists", f"{field}.sentences")
        pairs = list(zip(titles, sentences, strict=True))
    else:
        ref.check(value, list, field)
        pairs = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                pairs.append((item.get("title"), item.get("sentences")))
            elif isinstance(item, list) and len(item) == 2:
                pairs.append((item[0], item[1]))
            else:
                raise ref.error(
                    f"expected [title, [sentences]] or {{title, sentences}}, got {item!r:.80}",
                    f"{field}[{i}]",
                )
    out = []
    for i, (title, sents) in enumerate(pairs):
        ref.check(title, str, f"{field}[{i}].title")
        out.append(Paragraph(title=title, sentences=tuple(str_list(sents, ref, f"{field}[{i}]"))))
    return tuple(out)


def _fact_titles(value: Any, ref: RowRef, field: str) -> list[str]:
    """The title of every supporting fact, in listed order (one per supporting sentence).

    Accepts ``{"title": [...], "sent_id": [...]}`` (Hugging Face), ``[[title, sent_id], ...]``
    (original JSON) or ``[{"title": t, "sent_id": i}, ...]`` (normalized).
    """
    if isinstance(value, dict):
        return str_list(value.get("title"), ref, f"{field}.title")
    ref.check(value, list, field)
    titles = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            title = item.get("title")
        elif isinstance(item, list) and item:
            title = item[0]
        else:
            raise ref.error(f"expected [title, sent_id], got {item!r:.80}", f"{field}[{i}]")
        titles.append(ref.check(title, str, f"{field}[{i}].title"))
    return titles


def _extras(row: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {name: row[name] for name in names if row.get(name) is not None}


def hotpotqa_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """A HotpotQA (distractor) row as a sample.

    Source schemas: ``id``/``_id``, ``question``, ``answer``, ``type``, ``level``, ``context``
    (any layout of :func:`_paragraphs`) and ``supporting_facts`` (HF ``{title, sent_id}`` columns,
    original ``[[title, sent_id]]`` or normalized ``[{title, sent_id}]``); the local copy adds
    ``supporting_titles`` (titles once each), ``sf_granularity`` and ``source``.

    ``supporting_titles`` reproduces the reference code (spec §2.1, quirk 2): one title per
    supporting *sentence*, duplicates kept, in listed order, taken from ``supporting_facts``. Rows
    with only paragraph-level support (local ``sf_granularity == "paragraph"``: ``supporting_facts``
    null) use their ``supporting_titles`` field, one entry per title: the duplicates cannot be
    rebuilt for them. Whole paragraphs are kept; reducing them to the first sentence (quirk 1) is
    the task plugin's choice. Supporting titles are not checked against the context titles here.
    """
    question = ref.get(row, "question", str)
    answer = ref.get(row, "answer", str)
    context = _paragraphs(ref.get(row, "context", (list, dict)), ref, "context")
    facts = row.get("supporting_facts")
    if facts is not None:
        titles = tuple(_fact_titles(facts, ref, "supporting_facts"))
        granularity = "sentence"
    elif row.get("supporting_titles") is not None:
        titles = tuple(str_list(row["supporting_titles"], ref, "supporting_titles"))
        granularity = "paragraph"
    else:
        raise ref.error("missing or null, and there is no 'supporting_titles' either", "supporting_facts")
    metadata = _extras(row, "type", "level", "source")
    metadata["sf_granularity"] = row.get("sf_granularity") or granularity
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=(answer,),
        context=context,
        supporting_titles=titles,
        metadata=metadata,
    )


_NO_CONTEXT = (
    "null: this copy has {what} only (no {units}), but the split-context {dataset} task deals "
    "{units} between the agents; use {fix}, or pass require_context=False for a closed-book load"
)


def twowiki_sample(
    row: Mapping[str, Any], ref: RowRef, default_id: str, *, require_context: bool = True
) -> TaskSample:
    """A 2WikiMultihopQA row as a sample.

    Source schema (the original release, ``dev.json`` / ``train.json``, a JSON array): ``_id``,
    ``type``, ``question``, ``context`` ``[[title, [sentences]]]``, ``supporting_facts``
    ``[[title, sent_id]]``, ``evidences`` ``[[subject, relation, object]]``, ``answer``. The local
    copies have ``id``, ``question``, ``answer``, ``answer_aliases``, ``type``, ``context``
    ``[{title, sentences}]``, ``supporting_facts`` ``[{title, sent_id}]`` and ``sf_granularity``:
    ``sentence`` (``dev_200_context.jsonl``, the official facts) or ``paragraph``
    (``dev_ircot_paragraphs.jsonl``: one "sentence" per paragraph and one fact, ``sent_id`` 0, per
    supporting paragraph, in context order); ``dev_qa_only.jsonl`` has ``context`` and
    ``supporting_facts`` null.

    ``supporting_titles`` = the supporting-fact titles in listed order (one per fact, as the
    reference code deals them); ``answers`` = answer then aliases, de-duplicated.
    ``metadata["sf_granularity"]`` = the row's ``sf_granularity``, else ``sentence`` for rows
    with contexts (the original release's facts are sentences).

    Raises:
        DataError: ``context`` is missing or null and ``require_context`` is true.
    """
    question = ref.get(row, "question", str)
    answer = ref.get(row, "answer", str)
    aliases = row.get("answer_aliases")
    aliases = str_list(aliases, ref, "answer_aliases") if aliases is not None else []
    if row.get("context") is None:
        if require_context:
            raise ref.error(
                _NO_CONTEXT.format(
                    what="questions and answers",
                    units="context paragraphs",
                    dataset="2wikimultihopqa",
                    fix="the original 2WikiMultihopQA release (dev.json / train.json with 'context' "
                    "and 'supporting_facts') as <data_dir>/2wikimultihopqa/dev.json or via hf_name="
                    "<its path>",
                ),
                "context",
            )
        context, titles = (), ()
    else:
        context = _paragraphs(row["context"], ref, "context")
        facts = ref.get(row, "supporting_facts", (list, dict))
        titles = tuple(_fact_titles(facts, ref, "supporting_facts"))
    metadata = _extras(row, "type", "evidences", "dev_index", "source")
    if context:
        metadata["sf_granularity"] = row.get("sf_granularity") or "sentence"
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=unique((answer, *aliases)),
        context=context,
        supporting_titles=titles,
        metadata=metadata,
    )


def _search_results(value: Any, ref: RowRef) -> tuple[Paragraph, ...]:
    field = "search_results"
    if isinstance(value, dict):
        descriptions = str_list(value.get("description"), ref, f"{field}.description")
        titles = value.get("title")
        titles = [""] * len(descriptions) if titles is None else str_list(titles, ref, f"{field}.title")
        if len(titles) != len(descriptions):
            raise ref.error(f"{len(titles)} titles but {len(descriptions)} descriptions", f"{field}.title")
        pairs = list(zip(titles, descriptions, strict=True))
    else:
        ref.check(value, list, field)
        pairs = []
        for i, item in enumerate(value):
            ref.check(item, dict, f"{field}[{i}]")
            title = item.get("title") or ""
            pairs.append(
                (
                    ref.check(title, str, f"{field}[{i}].title"),
                    ref.check(item.get("description"), str, f"{field}[{i}].description"),
                )
            )
    return tuple(Paragraph(title=t, sentences=(d,)) for t, d in pairs)


def triviaqa_sample(
    row: Mapping[str, Any], ref: RowRef, default_id: str, *, require_context: bool = True
) -> TaskSample:
    """A TriviaQA row as a sample.

    Source schema (HF ``trivia_qa``, config ``rc``/``rc.nocontext``): ``question``,
    ``question_id``, ``question_source``, ``answer`` {``value``, ``aliases``,
    ``normalized_aliases``, ...}, ``search_results`` {``description``: [...], ``title``: [...],
    ``url``, ``rank``, ...}, ``entity_pages``. The local ``test_qa_only.jsonl`` has ``id``,
    ``question``, ``answer`` (a string), ``answer_aliases`` and ``search_results`` null.

    ``context`` = one paragraph per search result: title = the result's title, one sentence = its
    description (snippet), in listed order. ``answers`` = value then aliases, de-duplicated.

    Raises:
        DataError: ``search_results`` is missing or null and ``require_context`` is true.
    """
    question = ref.get(row, "question", str)
    answer = ref.get(row, "answer", (dict, str))
    if isinstance(answer, dict):
        value = ref.check(answer.get("value"), str, "answer.value")
        aliases = str_list(answer.get("aliases", []), ref, "answer.aliases")
    else:
        value = answer
        aliases = row.get("answer_aliases")
        aliases = str_list(aliases, ref, "answer_aliases") if aliases is not None else []
    answers = unique((value, *aliases))
    if not answers:
        raise ref.error("no non-empty answer or alias", "answer")
    if row.get("search_results") is None:
        if require_context:
            raise ref.error(
                _NO_CONTEXT.format(
                    what="questions and answer aliases",
                    units="search snippets",
                    dataset="triviaqa",
                    fix="the Hugging Face trivia_qa 'rc' data (search_results.description), e.g. source='hf'",
                ),
                "search_results",
            )
        context: tuple[Paragraph, ...] = ()
    else:
        context = _search_results(row["search_results"], ref)
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=answers,
        context=context,
        metadata=_extras(row, "question_source"),
    )


def cbt_sample(row: Mapping[str, Any], ref: RowRef, default_id: str) -> TaskSample:
    """A Children's Book Test row as a sample.

    Source schema (HF ``cbt``, config ``CN``): ``sentences`` (20 story sentences), ``question`` (the
    21st sentence with the blank written ``XXXXX``), ``options`` (10 candidate words), ``answer``.

    ``context`` = one untitled paragraph per sentence, in order; ``options`` kept in order;
    ``answers`` = ``(answer,)``.

    Raises:
        DataError: A field is missing or mistyped, or ``answer`` is not among ``options``.
    """
    sentences = str_list(ref.get(row, "sentences", list), ref, "sentences")
    question = ref.get(row, "question", str)
    options = str_list(ref.get(row, "options", list), ref, "options")
    answer = ref.get(row, "answer", str)
    if answer not in options:
        raise ref.error(f"{answer!r} is not among the options {options}", "answer")
    return TaskSample(
        id=sample_id(row, default_id),
        question=question,
        answers=(answer,),
        context=tuple(Paragraph(title="", sentences=(s,)) for s in sentences),
        options=tuple(options),
    )
