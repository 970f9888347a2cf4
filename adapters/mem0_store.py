"""mem0 (OSS) on the project's Postgres: a pgvector collection, the project's embedder (same
model and dimensions) and the project's LLM. Its history database lives in the data folder and
its telemetry is off. Every call takes server-built, validated ids; client input never becomes a
filter (mem0 treats "*" in a filter as a wildcard)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from chatmem.adapters.embedders import MINILM
from chatmem.memory.ports import Embedder
from chatmem.schemas.events import validate_identifier

COLLECTION = "chatmem_memories"
USER_INDEX = f"{COLLECTION}_user"
SETUP_LOCK = f"{COLLECTION}_setup"  # an advisory lock's name: one process makes the table at a time
SETUP_WAIT_S = 60
_shared: dict[str, Any] = {}


def _prepare_environment(data_dir: Path) -> Path:
    mem0_dir = (data_dir / "mem0").resolve()
    mem0_dir.mkdir(parents=True, exist_ok=True)
    # mem0 reads these when imported: set them first, or it writes to ~/.mem0 and phones home.
    os.environ["MEM0_DIR"] = str(mem0_dir)
    os.environ["MEM0_TELEMETRY"] = "False"
    return mem0_dir


class _Mem0Embedding:
    """mem0's embedder interface over the project's embedder (and its cache)."""

    def __init__(self, config: Any = None):
        self.config = config
        self.inner: Embedder = _shared["embedder"]

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        inner = _shared.get("query_embedder", self.inner) if memory_action == "search" else self.inner
        return inner.embed([text])[0].tolist()

    def embed_batch(self, texts: list[str], memory_action: str = "add") -> list[list[float]]:
        return [v.tolist() for v in self.inner.embed(list(texts))]


class _Mem0OfflineLLM:
    """The offline provider as mem0 sees it: facts by pattern, as JSON. Offline writes use
    infer=False, so mem0 only needs this if asked to infer."""

    def __init__(self, config: Any = None):
        self.config = config

    def generate_response(
        self, messages: list[dict], tools: Any = None, tool_choice: str = "auto", **kwargs: Any
    ) -> str:
        from chatmem.memory.facts import extract

        text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        return json.dumps({"facts": [f.text for f in extract(text)]})


@contextmanager
def one_at_a_time(pool: Any) -> Iterator[None]:
    """Workers start together, and mem0 makes its table when it starts: two processes making it at
    once collide in Postgres's catalog (a unique violation on pg_type, logged with a traceback,
    and that process's mem0 fails to start). A session lock held on a connection of its own (mem0
    takes the pool's, which may have one) lets one process make the table and its index while
    the others wait; closing the connection releases it."""
    # Bounded waits: a server that does not answer, or a process stuck holding the lock, fails
    # this start (the next use of mem0 tries again) instead of hanging it.
    with psycopg.connect(pool.conninfo, autocommit=True, connect_timeout=SETUP_WAIT_S) as conn:
        conn.execute(f"SET lock_timeout = '{SETUP_WAIT_S}s'")
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (SETUP_LOCK,))
        yield


class Mem0Store:
    def __init__(
        self,
        pool: Any,
        data_dir: Path,
        embedder: Embedder,
        *,
        llm_api_key: str | None,
        llm_base_url: str | None,
        llm_model: str,
        query_embedder: Embedder | None = None,
    ):
        mem0_dir = _prepare_environment(data_dir)
        _shared["embedder"] = embedder
        if query_embedder is not None:
            _shared["query_embedder"] = query_embedder
        from mem0 import Memory
        from mem0.utils.factory import LlmFactory

        # mem0 says twice per process that spaCy is missing. chatmem uses none of mem0's spaCy
        # features (their models would be downloaded), so the warning tells a user nothing.
        logging.getLogger("mem0.utils.spacy_models").setLevel(logging.ERROR)

        LlmFactory.register_provider("chatmem_offline", f"{__name__}._Mem0OfflineLLM")
        config = {
            "vector_store": {
                "provider": "pgvector",
                "config": {
                    "connection_pool": pool,  # the project's pool: checked connections, one set per process
                    "collection_name": COLLECTION,
                    "embedding_model_dims": embedder.dim,
                    "hnsw": True,
                },
            },
            # mem0 validates provider names against fixed lists, so the project's embedder and
            # offline LLM are installed on the instance below; these entries pass the checks.
            # Its `openai` embedder only builds a client (no request, no model loaded, no torch);
            # it is replaced before any use. (Its `huggingface` one would load a second copy of
            # the model through sentence-transformers, which needs torch.)
            "embedder": {
                "provider": "openai",
                "config": {"api_key": "unused", "model": MINILM, "embedding_dims": embedder.dim},
            },
            "llm": {
                "provider": "openai",
                "config": {
                    "api_key": llm_api_key or "offline",
                    "model": llm_model,
                    **({"openai_base_url": llm_base_url} if llm_base_url else {}),
                },
            },
            "history_db_path": str(mem0_dir / "history.db"),
        }
        with one_at_a_time(pool):
            self.memory = Memory.from_config(config)
            self.memory.embedding_model = _Mem0Embedding()  # same model and cache as the pipeline
            self._index_users(pool)
        self.infer = bool(llm_api_key)
        if not self.infer:
            self.memory.llm = LlmFactory.create("chatmem_offline")

    def _index_users(self, pool: Any) -> None:
        """mem0 filters every search by user and orders it by distance. Once its table is large,
        the planner takes the HNSW index, which returns the nearest rows of all users and filters
        them afterwards, so for most users nothing is left: at 100,000 memories of 20,000 users,
        none of 100 users asked got any of their five (docs/benchmarks.md). With an index on the
        user, the planner reads that user's rows and sorts them exactly."""
        self.memory.vector_store.create_col()  # mem0 makes its table on first use; this is idempotent
        with pool.connection() as conn:
            if conn.execute("SELECT to_regclass(%s) IS NULL", (USER_INDEX,)).fetchone() == (True,):
                conn.execute(f"CREATE INDEX {USER_INDEX} ON {COLLECTION} ((payload ->> 'user_id'))")
                conn.execute(f"ANALYZE {COLLECTION}")

    def add(self, text: str, *, user_id: str, run_id: str, metadata: dict[str, Any]) -> list[str]:
        result = self.memory.add(
            text, user_id=validate_identifier(user_id, "user_id"), run_id=run_id, metadata=metadata, infer=self.infer
        )
        return [r["id"] for r in result.get("results", []) if r.get("event", "ADD") in ("ADD", "UPDATE")]

    def find(self, *, user_id: str, fact_id: int) -> list[str]:
        """mem0 ids already written for a fact (the retry check of the write ledger)."""
        found = self.memory.get_all(
            filters={"user_id": validate_identifier(user_id, "user_id"), "chatmem_fact_id": str(int(fact_id))}, top_k=10
        )
        return [r["id"] for r in found.get("results", [])]

    def delete(self, memory_id: str) -> None:
        self.memory.delete(memory_id)

    def erase_user(self, user_id: str, memory_ids: Sequence[str] = ()) -> dict[str, int]:
        """Everything mem0 holds about a user: their memories (and the given ids, in case a
        filter misses one), the history rows that keep old texts of them, and the messages it
        was sent for that user."""
        user_id = validate_identifier(user_id, "user_id")
        found = self.memory.get_all(filters={"user_id": user_id}, top_k=100_000).get("results", [])
        counts = self.erase_memories(sorted({r["id"] for r in found} | set(memory_ids)))
        db = self.memory.db
        with db._lock:  # mem0 serialises its own writes with this lock
            db.connection.execute("PRAGMA secure_delete = ON")
            scope = "user_id=" + user_id.replace("%", "%25").replace("&", "%26").replace("=", "%3D")
            tail = "&" + scope  # scopes are sorted key=value pairs; user_id comes last
            counts["mem0_history"] += db.connection.execute(
                "DELETE FROM messages WHERE session_scope = ? OR substr(session_scope, -?) = ?",
                (scope, len(tail), tail),
            ).rowcount
            db.connection.commit()
        return counts

    def erase_memories(self, memory_ids: Sequence[str]) -> dict[str, int]:
        """Delete these memories and their history rows (mem0's delete writes one more, with the
        old text). Deleted rows are overwritten with zeros, not left in free pages of the file."""
        ids, deleted = list(memory_ids), 0
        for memory_id in ids:
            try:
                self.memory.delete(memory_id)
            except Exception:  # already gone
                continue
            deleted += 1
        db = self.memory.db
        history = 0
        with db._lock:
            db.connection.execute("PRAGMA secure_delete = ON")
            if ids:
                history = db.connection.execute(
                    f"DELETE FROM history WHERE memory_id IN ({','.join('?' * len(ids))})", ids
                ).rowcount
            db.connection.commit()
        return {"mem0_memories": deleted, "mem0_history": history}

    @contextmanager
    def searching_with(self, embedder: Embedder) -> Iterator[None]:
        """Searches embed their query with `embedder` meanwhile (the recall ranker's trainer asks
        with encoders trained without the conversation asked). mem0 builds its embedder itself,
        so the one it searches with is process-wide."""
        before = _shared.get("query_embedder")
        _shared["query_embedder"] = embedder
        try:
            yield
        finally:
            if before is None:
                _shared.pop("query_embedder", None)
            else:
                _shared["query_embedder"] = before

    def search(self, query: str, *, user_id: str, limit: int = 5, thread_id: str | None = None) -> list[dict]:
        filters: dict[str, Any] = {"user_id": validate_identifier(user_id, "user_id")}
        if thread_id is not None:
            filters["thread_id"] = validate_identifier(thread_id)
        return self.memory.search(query, filters=filters, top_k=limit).get("results", [])
