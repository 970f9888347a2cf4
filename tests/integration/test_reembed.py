"""Re-embedding with a second embedder (feature hashing, 64-d) on the real Postgres, while reads
run in a loop: no read fails during the rebuild or at the switch, every read finds what it
should, all vectors afterwards are the new model's, live processing resumes with it, and
running it again with the first embedder rolls back."""

import threading

from chatmem.adapters.embedders import MINILM
from chatmem.adapters.embedding_state_pg import EmbedderSpec
from tests.conftest import scalar
from tests.integration.test_episodes import Driver
from tests.integration.test_read_path import conversation, memory  # noqa: F401 - the shared fixture

HASHING = EmbedderSpec("hashing", "hashing-64", 64)


def models(c, table):
    with c.pool.connection() as conn:
        rows = conn.execute(
            f"""SELECT DISTINCT x.embed_model, vector_dims(x.embedding) FROM {table} x
                JOIN threads t ON t.thread_id = x.thread_id AND t.generation = x.generation
                WHERE x.embedding IS NOT NULL"""
        ).fetchall()
    return set(rows)


def test_reembed_switches_models_without_a_failed_read(memory):  # noqa: F811
    c = memory
    assert models(c, "messages") == {(MINILM, 384)}
    reads, failures, stop = [], [], threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            try:
                hits = c.recall("alice", "what is the locker code at the allotment?", limit=5).hits
                reads.append(any("4512" in h.snippet for h in hits))
            except Exception as error:  # noqa: BLE001 - the failure is what the test looks for
                failures.append(repr(error))

    reader = threading.Thread(target=read_loop)
    reader.start()
    progress = []
    try:
        done = c.reembed(HASHING, on_progress=lambda n, total: progress.append((n, total)))
    finally:
        stop.set()
        reader.join(30)
    assert failures == []
    assert reads and all(reads)  # every read during the rebuild and the switch found it
    assert done["threads"] == 2 and progress[-1][0] == progress[-1][1] == done["events"]
    assert c.embedding_state.spec() == HASHING
    assert models(c, "messages") == {("hashing-64", 64)}
    assert models(c, "summaries") <= {("hashing-64", 64)}
    hits = c.recall("alice", "locker code allotment", limit=5).hits
    assert any("4512" in h.snippet for h in hits)

    # Live processing resumes, with the new model.
    d = Driver(c)
    d.publish(conversation("garden", "alice", ["The shed key is under the blue pot."], start=80))
    d.advance("garden")
    new_model = "SELECT embed_model FROM messages m JOIN threads t USING (thread_id, generation) WHERE m.text LIKE %s"
    assert scalar(c, new_model, "The shed key%") == "hashing-64"

    # Rollback: the first embedder again (its vectors are still cached).
    c.reembed(EmbedderSpec("minilm", MINILM, 384))
    assert c.embedding_state.spec().model == MINILM
    assert models(c, "messages") == {(MINILM, 384)}
