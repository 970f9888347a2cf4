"""The attachment job: one per attachment of a message (event_id, position), on the
`attachments` queue. Fetch the bytes, sniff their type, store them by sha256, link the reference
to the artifact, and (only the first time those bytes are seen) analyse and embed them.

A bad file is a permanent failure with a reason in words; only transient failures (an
unreachable URL, a model endpoint down) are retried."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import Sniffed, declared_mismatch, sniff
from chatmem.memory.attachments.ports import Analyze, AttachmentStore, BlobStore, Fetcher, Reference
from chatmem.memory.ports import Embedder, TransientError, concrete


@dataclass
class AttachmentJob:
    store: AttachmentStore
    blobs: BlobStore
    fetcher: Fetcher
    analyze: Analyze
    embedder: Embedder
    guess_binary: Callable[[bytes], str | None]
    claim_s: int = 900

    def __call__(self, event_id: str, position: int, *, last_attempt: bool = False) -> str:
        """Process one attachment and return the outcome in a word. A TransientError propagates
        to be retried, except on the last attempt, which records the failure instead."""
        ref = self.store.reference(event_id, position)
        if ref is None:
            raise ValueError(f"no attachment {position} of event {event_id!r}")
        if ref.status == "failed":
            return "failed"
        try:
            if ref.status == "pending":
                ref = self._link(ref)
            if ref.artifact_status in ("done", "failed"):
                return f"artifact {ref.artifact_status}"  # analysed once, for every message that sends it
            return self._process(ref)
        except BadFile as error:
            self.store.fail_reference(event_id, position, error.reason)
            return "failed"
        except TransientError as error:
            if not last_attempt:
                raise
            if ref.status == "linked" and ref.sha256:
                self.store.fail_artifact(ref.sha256, f"gave up after retries: {error}")
            else:
                self.store.fail_reference(event_id, position, f"gave up after retries: {error}")
            return "failed"

    def reanalyse(
        self, sha256: str, mime: str, kind: str, filename: str | None, analyze: Analyze | None = None
    ) -> None:
        """Analyse stored bytes again (a new vision or OCR model) and swap the result in at once:
        a read sees the old texts or the new, never a mix. A file that fails now keeps the old.
        `analyze` stands in for the job's own (a video's, with the speech it heard before)."""
        analysis = (analyze or self.analyze)(self.blobs.get(sha256), Sniffed(mime, kind), filename)
        embedder = concrete(self.embedder)
        vectors = embedder.embed([t.text for t in analysis.texts]) if analysis.texts else np.zeros((0, embedder.dim))
        self.store.replace_analysis(sha256, analysis, vectors, model=embedder.model)

    def _link(self, ref: Reference) -> Reference:
        att = ref.attachment
        data = self.fetcher.fetch(att["url"])
        sniffed = sniff(data, att.get("filename"), self.guess_binary)
        mismatch = declared_mismatch(att.get("kind"), att.get("mime_type"), sniffed)
        if mismatch:
            raise BadFile(mismatch)
        sha = self.blobs.put(data)
        if att.get("caption"):
            embedder = concrete(self.embedder)
            vector = embedder.embed([att["caption"]])[0]
            self.store.save_caption(ref, att["caption"], vector, model=embedder.model)
        status = self.store.link(ref, sha, sniffed, len(data))
        return Reference(
            ref.event_id,
            ref.position,
            ref.thread_id,
            ref.user_id,
            "linked",
            att,
            sha,
            status,
            sniffed.mime,
            sniffed.kind,
        )

    def _process(self, ref: Reference) -> str:
        sha = ref.sha256
        assert sha is not None and ref.mime and ref.kind
        if not self.store.claim(sha, self.claim_s):
            return "claimed elsewhere"  # the claimant refreshes every message that sent it
        try:
            analysis = self.analyze(self.blobs.get(sha), Sniffed(ref.mime, ref.kind), ref.attachment.get("filename"))
            embedder = concrete(self.embedder)
            vectors = embedder.embed([t.text for t in analysis.texts]) if analysis.texts else None
        except BadFile as error:
            self.store.fail_artifact(sha, error.reason)
            return "failed"
        except BaseException:
            self.store.release(sha)
            raise
        empty = np.zeros((0, embedder.dim))
        self.store.finish(sha, analysis, vectors if vectors is not None else empty, model=embedder.model)
        return "done"
