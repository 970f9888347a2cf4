"""`chatmem bench locomo`: evidence recall@k on LoCoMo through the whole pipeline. Each
conversation is published as events (publisher -> Redis -> ingest -> workers), the run waits
until the workers are done, then every question is a `recall` scoped to its thread; results
map to dia_ids (a message is its own id, a summary or fact the ids it came from), best first.
Measure as in ../shared/eval/README.md. Printed, never asserted."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chatmem.bench.ingest import scratch
from chatmem.bench.pipeline import pipeline_processes, wait_until_settled
from chatmem.producers.importers import locomo_events
from chatmem.producers.publisher import Publisher
from chatmem.schemas.read import RecallHit, Scope
from chatmem.schemas.settings import Settings

KS = (5, 10, 25)
QUESTION_CATEGORIES = (1, 2, 3, 4)  # 5 is adversarial (no answer)
REFERENCES = {  # dev split, computed on turns (../shared/eval/README.md)
    "BM25": (0.447, 0.527, 0.630),
    "all-MiniLM-L6-v2 dense": (0.401, 0.494, 0.628),
    "BM25 + MiniLM, RRF": (0.482, 0.570, 0.724),
}


def hit_ids(hit: RecallHit) -> list[str]:
    c = hit.citation
    if hit.kind == "message":
        return [c.platform_message_id] if c.platform_message_id else []
    return list(c.source_ids) or ([c.platform_message_id] if c.platform_message_id else [])


def evidence_recall(evidence: list[str], retrieved: list[str], k: int) -> float:
    return len(set(evidence) & set(retrieved[:k])) / len(set(evidence))


def run(settings: Settings, console: Console, data: Path, out: Path | None, samples: set[str] | None = None) -> dict:
    corpus = [s for s in json.loads(Path(data).read_text()) if samples is None or s["sample_id"] in samples]
    events = list(locomo_events(data, samples))
    with scratch(settings) as c:
        with pipeline_processes(c):
            t0 = time.perf_counter()
            with Publisher.from_settings(c.settings, c.urls.redis_url) as pub:
                pub.publish_many(events)
            settle_s = wait_until_settled(c, len(events), t0)
        with c.pool.connection() as conn:
            counts = conn.execute(
                """SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM summaries),
                          (SELECT count(*) FROM facts), (SELECT count(*) FROM messages WHERE NOT is_active)"""
            ).fetchone()

        scores: dict[int, list[float]] = {k: [] for k in KS}
        latencies = []
        lines = []
        for sample in corpus:
            sid = sample["sample_id"]
            turn_ids = {t["dia_id"] for k, v in sample["conversation"].items() if isinstance(v, list) for t in v}
            reader = sample["conversation"]["speaker_a"]
            for qa_index, qa in enumerate(sample["qa"]):
                # Every question gets a prediction; only categories 1-4 with evidence are scored.
                scored = qa.get("category") in QUESTION_CATEGORIES
                evidence = [e for e in qa.get("evidence", []) if e in turn_ids] if scored else []
                t1 = time.perf_counter()
                result = c.recall(reader, qa["question"], scope=Scope.ALL, limit=max(KS), thread_id=sid)
                latencies.append(time.perf_counter() - t1)
                retrieved: list[str] = []
                for h in result.hits:
                    retrieved += [i for i in hit_ids(h) if i not in retrieved]
                lines.append({"sample_id": sid, "qa_index": qa_index, "retrieved": retrieved})
                if evidence:
                    for k in KS:
                        scores[k].append(evidence_recall(evidence, retrieved, k))
    if out:
        out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    figures = {k: sum(v) / len(v) if v else 0.0 for k, v in scores.items()}
    latencies.sort()
    table = Table(
        title=f"chatmem bench locomo · {data.name} · {len(corpus)} conversations, {len(scores[10])} questions · "
        f"{os.cpu_count()} cores · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("retriever", *(f"recall@{k}" for k in KS)):
        table.add_column(col)
    table.add_row("chatmem recall (this run)", *(f"{figures[k]:.3f}" for k in KS))
    for name, ref in REFERENCES.items():
        table.add_row(f"{name} (reference)", *(f"{x:.3f}" for x in ref))
    console.print(table)
    console.print(
        f"pipeline: {len(events)} turns processed in {settle_s:.0f}s · {counts[0]} episodes · {counts[1]} summaries · "
        f"{counts[2]} facts · {counts[3]} archived messages · recall p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms"
        f" p95 {latencies[int(len(latencies) * 0.95)] * 1e3:.1f} ms · target recall@10 ≥ 0.75"
    )
    return figures
