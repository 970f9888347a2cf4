"""A LoCoMo-format file imported with `chatmem import locomo`, processed by real workers, then
answered through recall, build_context and `chatmem recall` / `chatmem context`."""

import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

from tests.conftest import ROOT, scalar, settings_env, spawn, stop, wait_for
from tests.locomo_sample import write_sample

pytestmark = pytest.mark.e2e


def cli(settings, *args):
    return subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", *args],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_imported_conversation_is_recalled_with_dia_id_citations(container, tmp_path):
    s = container.settings
    procs = [spawn(s, "ingest"), spawn(s, "worker", "--queues", "all", "--concurrency", "2")]
    try:
        out = cli(s, "import", "locomo", str(write_sample(tmp_path)))
        assert out.returncode == 0 and "published 7 events" in out.stdout, out.stdout + out.stderr
        applied = lambda: scalar(container, "SELECT coalesce(sum(message_count), 0) FROM threads") == 7  # noqa: E731
        assert wait_for(applied, timeout=120), stop(procs[1])[-3000:]
        # The first session's episode closes on the time gap: its final summary archives it.
        final = lambda: scalar(container, "SELECT count(*) FROM summaries WHERE kind = 'final'") >= 1  # noqa: E731
        assert wait_for(final, timeout=120), stop(procs[1])[-3000:]
    finally:
        for p in procs:
            stop(p)
    dog = container.recall("Maya", "What is the name of Maya's dog?", thread_id="conv-test", limit=3).hits
    # The learned ranker puts the adoption of the dog (D1:1) and its name (D1:3) first, in either order.
    assert {h.citation.platform_message_id for h in dog[:2]} == {"D1:1", "D1:3"} and all(h.archived for h in dog[:2])
    bike = container.recall("Maya", "What colour is Leo's bicycle?", thread_id="conv-test", limit=3).hits
    assert "D1:4" in [h.citation.platform_message_id for h in bike]  # found by the image caption
    bundle = container.build_context("conv-test", "Maya", "pottery class")
    assert bundle.messages[-1]["content"].startswith("Nice, I am training for the Lisbon half marathon")

    out = cli(s, "recall", "What did Maya make in pottery class?", "--user", "Maya", "--json", "--limit", "3")
    assert out.returncode == 0, out.stderr
    assert "D2:2" in [h["citation"]["platform_message_id"] for h in json.loads(out.stdout)["hits"]]
    out = cli(s, "context", "conv-test", "--user", "Maya", "--query", "dog")
    assert out.returncode == 0 and "recent_turns" in out.stdout, out.stderr
    out = cli(s, "episodes", "conv-test", "--user", "Maya")
    assert out.returncode == 0 and "conv-test#1" in out.stdout
    out = cli(s, "threads", "--user", "Leo")
    assert out.returncode == 0 and "conv-test" in out.stdout
    out = cli(s, "recall", "dog", "--user", "Nobody", "--thread", "conv-test")
    assert out.returncode == 1 and "no thread" in out.stdout

    # The ranker's trainer reads the same pools recall ranks: each question's evidence is among
    # its candidates, and a model fitted on them puts it first (in-sample, three questions).
    from chatmem.bench.train_ranker import collect, fit_bag, weights_json
    from chatmem.memory.recall import load_ranker
    from tests.locomo_sample import SAMPLE

    pools = collect(container, SAMPLE, container.recall.embedder)
    assert len(pools) == 3 and all(p.relevant.sum() == 1 for p in pools)
    model = load_ranker(weights_json(fit_bag(pools), {}))
    assert all(p.relevant[int(model.logit(p.features).argmax())] for p in pools)

    # `bench locomo --bundles`: the bundles a bot gets quote each question's evidence. At the
    # default total every turn of the sample is a recent turn; with room for about one, the
    # evidence comes from retrieved messages.
    from chatmem.bench.locomo import _bundles, _report_bundles

    shown = _bundles(container, SAMPLE, (8000, 150))
    assert shown[8000]["all"] == [1.0, 1.0, 1.0]
    small = container.build_context("conv-test", "Maya", "What is the name of Maya's dog?", max_tokens=150)
    assert len(small.section("recent_turns").items) < 7 and small.tokens <= 150
    assert "D1:3" in {i.citation.platform_message_id for i in small.section("retrieved").items}
    assert shown[150]["all"][0] == 1.0  # the dog's name, an early turn
    figures = _report_bundles(Console(file=io.StringIO(), width=200), shown)
    assert figures[8000]["single-hop"] == 1.0 and figures[150]["tokens"] <= 150


def test_the_ranker_trainer_runs_end_to_end_on_a_sample(container, tmp_path):
    """`chatmem bench train-ranker` as `make train-ranker` runs it, on the one-conversation sample:
    processed by the real pipeline, weights written that the read path loads."""
    import io

    from rich.console import Console

    from chatmem.bench.train_ranker import run
    from chatmem.memory.recall import load_ranker

    out = tmp_path / "ranker.json"
    printed = io.StringIO()
    cv = run(container.settings, Console(file=printed, width=200), write_sample(tmp_path), out)
    assert cv["all"]["questions"] == 3 and cv["all"]["linear"] > 0
    assert "one conversation" in printed.getvalue()  # nothing to hold out: said, not scored 0
    model = load_ranker(out.read_text(encoding="utf-8"))
    assert json.loads(out.read_text(encoding="utf-8"))["trained"]["questions"] == 3
    assert len(model.members) == 5 and all(m.skip is not None for m in model.members)


def test_the_recall_latency_bench_compares_the_query_vectors_the_parallel_search_and_a_frozen_heap(container, tmp_path):
    import gc
    import io

    from rich.console import Console

    from chatmem.bench.host import machine
    from chatmem.bench.recall_latency import run

    printed = io.StringIO()
    # A file that repeats a turn id still settles (its second turn is the same event, stored once).
    sample = write_sample(tmp_path, repeated_turn=True)
    out = run(container.settings, Console(file=printed, width=200), sample, rounds=1)
    assert len(out) == 4 and all(0 < p50 <= p95 for p50, p95 in out.values())
    text = printed.getvalue()
    assert "beside the others (shipped)" in text and "p50 vs encoder off" in text
    # The shipped way again as the servers run it; the process's collector is left as it was.
    assert "heap frozen after warm-up" in text and "full collections" in text and "Container.warm_up" in text
    assert gc.get_freeze_count() == 0
    # The figures name the machine they were taken on (the title wraps to the table's width).
    assert " ".join(machine().split()) in " ".join(printed.getvalue().split())


def test_an_imported_whatsapp_chat_is_recalled_by_its_people(container):
    # The Android fixture through `chatmem import whatsapp`, real ingest and workers, then recall:
    # the host's message (a phone number in the export) is found by another member, cited.
    s = container.settings
    export = ROOT / "tests" / "fixtures" / "exports" / "whatsapp_android"
    procs = [spawn(s, "ingest"), spawn(s, "worker", "--queues", "all", "--concurrency", "2")]
    try:
        out = cli(s, "import", "whatsapp", str(export), "--timezone", "Europe/Lisbon", "--assistant", "Trip Bot")
        assert out.returncode == 0 and "10 new events published" in out.stdout, out.stdout + out.stderr
        applied = lambda: scalar(container, "SELECT coalesce(sum(message_count), 0) FROM threads") == 10  # noqa: E731
        assert wait_for(applied, timeout=120), stop(procs[1])[-3000:]
    finally:
        for p in procs:
            stop(p)
    hits = container.recall("whatsapp:Leo", "What is the key box code?", thread_id="whatsapp:Trip_planning").hits
    top = next(h for h in hits if h.kind == "message")
    assert "4471" in top.snippet, [h.snippet for h in hits]
    assert top.author == "whatsapp:351912345678" and top.citation.event_id.startswith("whatsapp:Trip_planning:")
    # Lisbon is on UTC in winter: the phone's 9:10 AM is 09:10 UTC
    assert top.citation.occurred_at.isoformat().startswith("2024-03-01T09:10:00")
