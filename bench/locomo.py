"""`chatmem bench locomo`: evidence recall@k on LoCoMo through the whole pipeline. Each
conversation is published as events (publisher -> Redis -> ingest -> workers), the run waits
until the workers are done, then every question is a `recall` scoped to its thread; results
map to dia_ids (a message is its own id, a summary or fact the ids it came from), best first.
Measure as in ../shared/eval/README.md, overall and per question category. Printed, never
asserted.

`--bundles` also asks build_context, as a bot would before it answers, at BUNDLE_TOTALS tokens:
how much of each question's evidence the bundle shows word for word (a recent turn or a
retrieved message), which is what the bot's model gets to read.

`--keep DIR` runs the services and the database under DIR and leaves them there; a later run
with the same DIR finds the conversations processed and only asks the questions (a minute, not
ten), for tuning the read path; a run that was interrupted goes on where it stopped. Delete DIR
after changing what the pipeline writes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from chatmem.adapters import migrate, services
from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.bench.pipeline import pipeline_processes, wait_until_settled
from chatmem.bench.stats import bootstrap
from chatmem.bootstrap import Container
from chatmem.producers.importers import locomo_events
from chatmem.producers.publisher import Publisher
from chatmem.schemas.read import ContextBundle, RecallHit, Scope, SectionName
from chatmem.schemas.settings import Settings

KS = (5, 10, 25)
QUESTION_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}  # 5 is adversarial
REFERENCES = {  # dev split, computed on turns (../shared/eval/README.md)
    "BM25": (0.447, 0.527, 0.630),
    "all-MiniLM-L6-v2 dense": (0.401, 0.494, 0.628),
    "BM25 + MiniLM, RRF": (0.482, 0.570, 0.724),
}
FULL_K = 10  # full@10: every evidence turn of a question in the first 10
BUNDLE_TOTALS = (8000, 4000, 2000)  # build_context's default total, a half and a quarter of it
SHOWN_SECTIONS: tuple[SectionName, ...] = ("recent_turns", "retrieved")  # they quote messages as they were


def hit_ids(hit: RecallHit) -> list[str]:
    c = hit.citation
    if hit.kind == "message":
        return [c.platform_message_id] if c.platform_message_id else []
    return list(c.source_ids) or ([c.platform_message_id] if c.platform_message_id else [])


def evidence_recall(evidence: list[str], retrieved: list[str], k: int) -> float:
    return len(set(evidence) & set(retrieved[:k])) / len(set(evidence))


def shown_ids(bundle: ContextBundle) -> set[str]:
    """The platform message ids a bundle quotes word for word."""
    return {
        i.citation.platform_message_id
        for name in SHOWN_SECTIONS
        for i in bundle.section(name).items
        if i.citation is not None and i.citation.platform_message_id
    }


@contextmanager
def kept(settings: Settings, data_dir: Path) -> Iterator[Container]:
    """Embedded services and their database under `data_dir`, left in place afterwards."""
    own = settings.model_copy(
        update={"data_dir": data_dir, "database_url": None, "redis_url": None, "spool_dir": None, "blob_dir": None}
    )
    with services.running(own) as urls:
        migrate.migrate(urls.database_url, own.vector_dim)
        c = Container(own, urls)
        try:
            yield c
        finally:
            c.close()


def _applied(c: Container, samples: list[str]) -> int:
    with c.pool.connection() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(message_count), 0) FROM threads WHERE thread_id = ANY(%s)", (samples,)
        ).fetchone()
    return int(row[0]) if row else 0


def _settled(c: Container, n_messages: int) -> bool:
    """A kept database whose pipeline finished (an interrupted run resumes where it stopped)."""
    try:
        wait_until_settled(c, n_messages, time.perf_counter(), limit_s=5)
    except TimeoutError:
        return False
    return True


@contextmanager
def processed(
    settings: Settings, data: Path, samples: set[str] | None = None, keep: Path | None = None
) -> Iterator[tuple[Container, list[dict], str]]:
    """The conversations of `data` processed by the real pipeline: the container, the corpus and
    a line saying what the pipeline did (or that a kept database was reused)."""
    corpus = [
        s for s in json.loads(Path(data).read_text(encoding="utf-8")) if samples is None or s["sample_id"] in samples
    ]
    events = list(locomo_events(data, samples))
    # A turn id a file repeats makes one event id, stored once: counting events would wait for a
    # message that never comes, until the settle limit (15 minutes) fails the run.
    n_messages = len({e.event_id for e in events if e.type == "message"})
    with kept(settings, keep) if keep else scratch(settings) as c:
        settle_s: float | None = None
        if not (keep and _settled(c, n_messages)):
            with pipeline_processes(c):
                t0 = time.perf_counter()
                if _applied(c, [s["sample_id"] for s in corpus]) < n_messages:
                    with Publisher.from_settings(c.settings, c.urls.redis_url) as pub:
                        pub.publish_many(events)  # event ids are fixed: a re-run stores nothing twice
                settle_s = wait_until_settled(c, n_messages, t0)
            # What autovacuum does a minute or so after a load: until then recall is planned
            # with the empty tables' statistics (docs/operations.md), and the figures would
            # depend on how soon the questions follow the processing.
            with psycopg.connect(c.urls.database_url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
        with c.pool.connection() as conn:
            row = conn.execute(
                """SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM summaries),
                          (SELECT count(*) FROM facts),
                          (SELECT count(*) FROM messages m JOIN episodes e USING (episode_id, generation)
                           WHERE e.archived)"""
            ).fetchone()
        counts = tuple(row) if row else (0, 0, 0, 0)  # aggregates: always one row
        pipeline = f"{n_messages} turns processed in {settle_s:.0f}s" if settle_s is not None else f"reused {keep}"
        yield (
            c,
            corpus,
            f"pipeline: {pipeline} · {counts[0]} episodes · {counts[1]} summaries · {counts[2]} facts · "
            f"{counts[3]} archived messages",
        )


def run(
    settings: Settings,
    console: Console,
    data: Path,
    out: Path | None,
    samples: set[str] | None = None,
    keep: Path | None = None,
    ranker: str = "learned",
    bundles: tuple[int, ...] = (),
) -> dict:
    """`ranker`: "learned" (the shipped model, the default) or "linear" (the hand-tuned rule it
    replaced). `bundles`: the totals at which to ask build_context too (BUNDLE_TOTALS)."""
    with processed(settings, data, samples, keep) as (c, corpus, done):
        if ranker == "linear":
            c.recall.ranker = None
        c.recall(corpus[0]["conversation"]["speaker_a"], "warm up", thread_id=corpus[0]["sample_id"])
        scores, latencies, lines = _ask(c, corpus)
        shown = _bundles(c, corpus, bundles)
    if out:
        out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    figures = _report(console, data, corpus, scores, ranker)
    if shown:
        figures["bundles"] = _report_bundles(console, shown)
    latencies.sort()
    console.print(
        f"{done} · recall p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms"
        f" p95 {latencies[int(len(latencies) * 0.95)] * 1e3:.1f} ms · target recall@10 ≥ 0.82"
    )
    return figures


Scores = dict[int, dict[str, list[float]]]  # category -> measure ("recall@5", ..., "full@10") -> per question


def _ask(c: Container, corpus: list[dict]) -> tuple[Scores, list[float], list[dict]]:
    scores: Scores = {cat: {} for cat in QUESTION_CATEGORIES}
    latencies: list[float] = []
    lines: list[dict] = []
    for sample in corpus:
        sid = sample["sample_id"]
        reader = sample["conversation"]["speaker_a"]
        for qa_index, (qa, evidence) in enumerate(_questions(sample)):
            # Every question gets a prediction; only those with evidence are scored.
            cat = qa.get("category")
            t1 = time.perf_counter()
            result = c.recall(reader, qa["question"], scope=Scope.ALL, limit=max(KS), thread_id=sid)
            latencies.append(time.perf_counter() - t1)
            retrieved: list[str] = []
            for h in result.hits:
                retrieved += [i for i in hit_ids(h) if i not in retrieved]
            lines.append({"sample_id": sid, "qa_index": qa_index, "category": cat, "retrieved": retrieved})
            if evidence:  # a scored question: one of QUESTION_CATEGORIES
                fig = scores[qa["category"]]
                for k in KS:
                    fig.setdefault(f"recall@{k}", []).append(evidence_recall(evidence, retrieved, k))
                fig.setdefault(f"full@{FULL_K}", []).append(float(evidence_recall(evidence, retrieved, FULL_K) == 1.0))
    return scores, latencies, lines


def _questions(sample: dict) -> Iterator[tuple[dict, list[str]]]:
    """Each question with the evidence it is scored on: the turn ids it names that exist, for
    categories 1-4; none (not scored) otherwise."""
    turn_ids = {t["dia_id"] for v in sample["conversation"].values() if isinstance(v, list) for t in v}
    for qa in sample["qa"]:
        scored = qa.get("category") in QUESTION_CATEGORIES
        yield qa, [e for e in qa.get("evidence", []) if e in turn_ids] if scored else []


def _evidence(sample: dict) -> Iterator[tuple[dict, list[str]]]:
    """The questions that are scored, and their evidence."""
    return ((qa, evidence) for qa, evidence in _questions(sample) if evidence)


Shown = dict[int, dict[str, list[float]]]  # total -> category name or "tokens" -> per question


def _bundles(c: Container, corpus: list[dict], totals: tuple[int, ...]) -> Shown:
    """Per total, the share of each question's evidence its bundle quotes, and the bundle's size."""
    shown: Shown = {total: {} for total in totals}
    for total in totals:
        for sample in corpus:
            reader = sample["conversation"]["speaker_a"]
            for qa, evidence in _evidence(sample):
                bundle = c.build_context(sample["sample_id"], reader, qa["question"], max_tokens=total)
                share = len(set(evidence) & shown_ids(bundle)) / len(set(evidence))
                shown[total].setdefault(QUESTION_CATEGORIES[qa["category"]], []).append(share)
                shown[total].setdefault("all", []).append(share)
                shown[total].setdefault("tokens", []).append(bundle.tokens)
    return shown


def _report_bundles(console: Console, shown: Shown) -> dict:
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    names = [*QUESTION_CATEGORIES.values(), "all"]
    table = Table(
        title="evidence quoted by build_context's bundle (a recent turn or a retrieved message), the settings' "
        "section budgets fitted to each total"
    )
    for col in ("max_tokens", *names, "tokens used, mean"):
        table.add_column(col)
    figures = {}
    for total, fig in shown.items():
        figures[total] = {name: mean(fig.get(name, [])) for name in [*names, "tokens"]}
        table.add_row(f"{total:,}", *(f"{figures[total][n]:.3f}" for n in names), f"{figures[total]['tokens']:,.0f}")
    console.print(table)
    return figures


def _report(console: Console, data: Path, corpus: list[dict], scores: Scores, ranker: str = "learned") -> dict:
    measures = [*(f"recall@{k}" for k in KS), f"full@{FULL_K}"]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    rows = {
        f"{name} ({cat})": {m: mean(scores[cat].get(m, [])) for m in measures}
        | {"n": len(scores[cat].get("full@10", []))}
        for cat, name in QUESTION_CATEGORIES.items()
    }
    every = {m: [x for cat in QUESTION_CATEGORIES for x in scores[cat].get(m, [])] for m in measures}
    overall = {m: mean(every[m]) for m in measures} | {"n": len(every[measures[-1]])}
    table = Table(
        title=f"chatmem bench locomo · {data.name} · {len(corpus)} conversations, {overall['n']} questions · "
        f"{ranker} ranker · "
        f"{machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("retriever / category", "questions", *measures):
        table.add_column(col)
    for name, fig in rows.items():
        table.add_row(f"chatmem recall · {name}", str(fig["n"]), *(f"{fig[m]:.3f}" for m in measures))
    table.add_row("chatmem recall · all", str(overall["n"]), *(f"{overall[m]:.3f}" for m in measures), style="bold")
    for name, ref in REFERENCES.items():
        table.add_row(f"{name} (reference)", str(overall["n"]), *(f"{x:.3f}" for x in ref), "")
    console.print(table)
    if every["recall@10"]:
        console.print(
            f"recall@10, all questions: {bootstrap(every['recall@10']).text('questions')}; the questions of one "
            "conversation are not independent, so the spread across conversations is wider than this interval"
        )
    return {"all": overall, **rows}
