"""What the read path returns: recall results with citations and the context bundle. These
are the HTTP API's response bodies too, so they are pydantic models."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SNIPPET_CHARS = 300
CONTEXT_CHARS = 150


class Scope(StrEnum):
    ALL = "all"
    SUMMARIES = "summaries"
    MESSAGES = "messages"
    FACTS = "facts"
    ARTIFACTS = "artifacts"


SourceKind = Literal["message", "summary", "fact", "artifact"]


class Citation(BaseModel):
    """Where a result came from, down to the event in the log."""

    model_config = ConfigDict(frozen=True)

    source: SourceKind
    thread_id: str
    episode_id: str | None = None
    seq: int | None = Field(None, description="position of the message in its thread (first one for a summary)")
    upto_seq: int | None = Field(None, description="last message a summary covers")
    platform_message_id: str | None = None
    event_id: str | None = Field(None, description="the event in the log")
    occurred_at: datetime | None = None
    source_ids: list[str] = Field(
        default_factory=list, description="platform message ids the result came from (summaries, facts)"
    )
    artifact_id: str | None = Field(None, description="sha256 of the attachment a result came from")
    artifact_text: str | None = Field(
        None,
        description="which text of the attachment: ocr, chunk, file_summary, vision_short, vision_detail, user_caption",
    )


class RecallHit(BaseModel):
    kind: SourceKind
    score: float
    snippet: str = Field(max_length=SNIPPET_CHARS)
    before: str | None = Field(None, description="the previous turn, for context", max_length=CONTEXT_CHARS)
    after: str | None = Field(None, description="the next turn, for context", max_length=CONTEXT_CHARS)
    archived: bool = False
    author: str | None = None
    citation: Citation


class RecallResult(BaseModel):
    query: str
    scope: Scope
    hits: list[RecallHit]


class Budgets(BaseModel):
    """Tokens per section; the total caps everything (see docs/read-path.md)."""

    model_config = ConfigDict(extra="forbid")

    total: int = Field(8000, ge=1)
    system: int = Field(1500, ge=0)
    summaries: int = Field(2000, ge=0, description="running summary, open loops and the highest-level summaries")
    recent_turns: int = Field(3000, ge=0)
    snippets: int = Field(1500, ge=0, description="facts, artifact snippets and retrieved archived snippets")


SectionName = Literal["system", "running", "summaries", "recent_turns", "facts", "artifacts", "retrieved"]
SECTION_ORDER: tuple[SectionName, ...] = (
    "system",
    "running",
    "summaries",
    "recent_turns",
    "facts",
    "artifacts",
    "retrieved",
)


class ContextItem(BaseModel):
    text: str
    tokens: int
    role: Literal["user", "assistant", "system"] | None = Field(None, description="recent turns only")
    author: str | None = None
    citation: Citation | None = None


class Section(BaseModel):
    name: SectionName
    items: list[ContextItem]
    tokens: int
    budget: int
    trimmed: int = Field(0, description="items left out to stay within the budget")


class ContextBundle(BaseModel):
    thread_id: str
    user_id: str
    query: str | None
    max_tokens: int
    tokens: int = Field(description="tokens of the rendered messages, as counted by `counter`")
    counter: str
    sections: list[Section]
    messages: list[dict] = Field(description="the bundle as OpenAI chat messages")

    def section(self, name: SectionName) -> Section:
        return next(s for s in self.sections if s.name == name)

    @property
    def citations(self) -> list[Citation]:
        return [i.citation for s in self.sections for i in s.items if i.citation is not None]


class KnownFact(BaseModel):
    category: str
    key: str
    value: str
    confidence: float | None = None


class EpisodeTitle(BaseModel):
    thread_id: str
    episode_id: str
    title: str | None = Field(None, description="the episode's topic label, once summarized")
    status: str
    started_at: datetime | None = None
    ended_at: datetime | None = None


class KnownAbout(BaseModel):
    """What memory holds about one user: active facts and the latest episodes of their threads
    (a chat's /whatdoyouknow, the MCP tool)."""

    user_id: str
    facts: list[KnownFact]
    episodes: list[EpisodeTitle]


class SummaryView(BaseModel):
    """An active summary as a reader sees it (a chat's /summary)."""

    kind: Literal["running", "chunk", "final", "rollup"]
    level: int
    episode_id: str | None
    from_seq: int
    upto_seq: int
    text: str
