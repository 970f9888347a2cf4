"""`replay --check` over facts and artifacts: a processed thread gives no difference; a fact, a
fact ledger entry, an artifact's text or its stored bytes changed behind the pipeline's back
each give one, and the CLI exits 1."""

from __future__ import annotations

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.events import Attachment
from tests.conftest import scalar, spawn
from tests.integration.test_attachments import REPORT, message, put, text_pdf
from tests.integration.test_episodes import Driver
from tests.scripted import command

pytestmark = pytest.mark.integration


def differing(diff: dict) -> dict:
    return {name: (a, b) for name, (a, b) in diff.items() if a or b}


@pytest.fixture
def processed(settings_factory, tmp_path):
    """Two threads of one user, processed as the workers would: 'home' states where she lives;
    'trip' states it again (an equal value: no row of its own), two new facts, a remember
    command and a PDF with a caption."""
    s = settings_factory()
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))  # type: ignore[arg-type]
    d = Driver(c)
    d.publish([message("home", "alice", 1, "I live in Berlin."), command("home", "close_episode", 2, 2, "alice")])
    d.advance("home")
    d.run_jobs(with_facts=True)
    url = put(tmp_path, "report.pdf", text_pdf(REPORT))
    d.publish(
        [
            message("trip", "alice", 1, "I live in Berlin. I prefer window seats.",
                    [Attachment(url=url, kind="document", caption="the budget report")]),
            message("trip", "alice", 2, "I work at Acme Robotics."),
            command("trip", "remember", 3, 3, "alice", text="my favourite airline is TAP"),
            command("trip", "close_episode", 4, 4, "alice"),
        ]
    )  # fmt: skip
    d.advance("trip")
    assert d.run_attachments() == ["done"]
    d.run_jobs(with_facts=True)
    yield s, c
    c.close()


def test_a_processed_thread_checks_clean_and_each_tampering_shows(processed):
    s, c = processed
    with c.pool.connection() as conn:
        rows = conn.execute("SELECT key, source FROM facts WHERE thread_id = 'trip' ORDER BY key").fetchall()
        ledger = conn.execute("SELECT result FROM fact_ledger WHERE op_key = 'trip#1:g1:facts'").fetchone()[0]
    # What the check has to get right: rows of extraction and of a remember, and an extracted
    # fact that owns no row here (Berlin was known from 'home').
    assert rows == [("employer", "extracted"), ("favourite airline is tap", "remember"), ("window seats", "extracted")]
    assert ledger.get("same") == 1 and [d["row"] for d in ledger["derived"]].count(False) == 1
    llm = c.llm("maintenance")
    diff = c.check_replay("trip", llm, "check")
    assert {"facts", "artifacts"} <= set(diff) and differing(diff) == {}
    assert scalar(c, "SELECT count(*) FROM messages WHERE thread_id = 'trip' AND generation <> 1") == 0
    assert scalar(c, "SELECT count(*) FROM facts") == 4  # the check wrote no fact (nor to mem0)

    # A fact's value changed in place.
    with c.pool.connection() as conn:
        conn.execute("UPDATE facts SET value = 'Initech' WHERE thread_id = 'trip' AND key = 'employer'")
    only_live, only_rebuilt = c.check_replay("trip", llm, "check")["facts"]
    assert [r[6] for r in only_live] == ["initech"] and [r[6] for r in only_rebuilt] == ["acme robotics"]
    with c.pool.connection() as conn:
        conn.execute("UPDATE facts SET value = 'Acme Robotics' WHERE thread_id = 'trip' AND key = 'employer'")
        # The remember's row lost, and an extraction's record of what it derived changed.
        conn.execute("DELETE FROM facts WHERE thread_id = 'trip' AND source = 'remember'")
        conn.execute(
            """UPDATE fact_ledger SET result = jsonb_set(result, '{derived,0,digest}', '"0000000000000000"')
               WHERE op_key = 'trip#1:g1:facts'"""
        )
    only_live, only_rebuilt = c.check_replay("trip", llm, "check")["facts"]
    assert [r[0] for r in only_live] == ["derived"] and sorted(r[0] for r in only_rebuilt) == ["derived", "fact"]
    assert [r[1:3] for r in only_rebuilt if r[0] == "fact"] == [("remember", "trip-cmd-3")]

    # An artifact's derived text changed, and its stored bytes.
    with c.pool.connection() as conn:
        conn.execute("UPDATE artifact_text SET text = 'nothing to see' WHERE kind = 'file_summary'")
        sha = conn.execute("SELECT sha256 FROM artifacts").fetchone()[0]
    c.blobs.path(sha).write_bytes(b"%PDF-1.4 not the same bytes")
    only_live, only_rebuilt = c.check_replay("trip", llm, "check")["artifacts"]
    assert sorted(r[0] for r in only_live) == ["blob", "texts"] and sorted(r[0] for r in only_rebuilt) == [
        "blob",
        "texts",
    ]

    cli = spawn(s, "replay", "--thread", "trip", "--check")
    out, _ = cli.communicate(timeout=300)
    assert cli.returncode == 1, out[-2000:]
    assert "facts 3 differences" in out and "artifacts 4 differences" in out, out[-2000:]
    assert "episodes 0 differences" in out


def test_a_lost_reference_or_caption_shows_and_the_cli_passes_a_clean_thread(processed):
    s, c = processed
    cli = spawn(s, "replay", "--thread", "trip", "--check")
    out, _ = cli.communicate(timeout=300)
    assert cli.returncode == 0 and "reproduces all 1 thread(s) exactly" in out, out[-2000:]
    llm = c.llm("maintenance")
    with c.pool.connection() as conn:
        conn.execute("UPDATE artifact_text SET text = 'another caption' WHERE kind = 'user_caption'")
    only_live, only_rebuilt = c.check_replay("trip", llm, "check")["artifacts"]
    assert [r[0] for r in only_live] == ["caption"] and [r[0] for r in only_rebuilt] == ["caption"]
    with c.pool.connection() as conn:
        conn.execute("DELETE FROM attachments WHERE event_id = 'trip-1'")
    only_live, only_rebuilt = c.check_replay("trip", llm, "check")["artifacts"]
    # The reference row is gone (and with it what is read through it); the log still holds it.
    assert only_live == [] and [r[0] for r in only_rebuilt] == ["reference"]
