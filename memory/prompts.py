"""Prompts: pure, versioned functions next to the response models they ask for. A prompt's
`input` is what the LLM cache hashes (with the model and the version), so changing a prompt
means bumping its version."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field


class Line(BaseModel):
    seq: int
    role: str
    text: str
    # The author's display name where the platform sent one: who said what in a group, and the
    # text the message's vector was computed from (see embed_text). Left out of the prompt when
    # absent, so prompts of threads without names stay byte for byte what they were.
    name: str | None = None

    def prompt_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    def embedding_text(self) -> str:
        return named_text(self.name, self.text)


def named_text(name: str | None, text: str) -> str:
    """A message's text as embedded: after its author's name when there is one."""
    return f"{name}: {text}" if name else text


class RunningSummary(BaseModel):
    summary: str = Field(description="what the conversation is about so far, a few sentences")
    open_loops: list[str] = Field(default_factory=list, description="unanswered questions, promises, to-dos")


class FinalSummary(BaseModel):
    topic: str
    topic_label: str = Field(description="two to five words")
    summary: str
    decisions: list[str] = Field(default_factory=list)
    todos: list[str] = Field(default_factory=list)
    facts_candidates: list[str] = Field(default_factory=list, description="durable facts about the user")
    entities: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)
    open_questions: list[str] = Field(default_factory=list)


class FactItem(BaseModel):
    seq: int = Field(description="the message the fact was stated in, by its seq in the input")
    category: Literal["identity", "preference", "constraint", "instruction", "decision"]
    key: str = Field(description="what the fact is about, a few lowercase words, e.g. 'name', 'allergy peanuts'")
    value: str
    confidence: float = Field(ge=0, le=1)
    importance: float = Field(ge=0, le=1)
    text: str = Field(description="the sentence it was stated in")


class FactList(BaseModel):
    facts: list[FactItem] = Field(default_factory=list)


class RollupSummary(BaseModel):
    summary: str
    topics: list[str] = Field(default_factory=list)


class FileSummary(BaseModel):
    title: str = Field(description="what the file is, a few words")
    summary: str = Field(description="what it says, two to four sentences")


class ImageDescription(BaseModel):
    short: str = Field(description="one line, at most 15 words: what the image shows")
    detail: str = Field(description="a paragraph: everything visible that someone might ask about later")


class TurnIntent(BaseModel):
    seq: int
    intent: Literal["new_request", "follow_up", "answer", "reaction", "social"] = Field(
        description="new_request: brings up something not being discussed; follow_up: asks more about or adds to "
        "what is being discussed; answer: answers or carries out a request; reaction: agrees, thanks, corrects; "
        "social: greeting, small talk, goodbye"
    )
    topic: str = Field(description="what the turn is about, a few words")


class TopicShift(BaseModel):
    """Def-DTS style: summarise both sides, label each turn's intent, then deduce the answer."""

    context_before: str = Field(description="what the conversation is about before the candidate turn, one sentence")
    context_after: str = Field(description="what the candidate turn and the turns after it are about, one sentence")
    turns: list[TurnIntent] = Field(default_factory=list, description="the candidate turn and each turn after it")
    new_topic: bool = Field(description="whether the candidate turn starts a topic other than context_before")


@dataclass(frozen=True)
class Prompt:
    name: str
    version: str
    system: str
    input: dict[str, Any]
    response_model: type[BaseModel]

    def user_text(self) -> str:
        return json.dumps(self.input, ensure_ascii=False, indent=1)


def numbered(lines: list[Line], start: int = 1) -> list[dict[str, Any]]:
    """The lines as a prompt shows them, numbered by their place in the prompt, not in the thread.
    A message deleted or erased early in a thread then leaves the prompts of the later episodes,
    and so their cached outputs, as they were: its rebuild asks the model again only about the
    episode that held it. An answer's `seq` is that number (FactItem)."""
    return [{**ln.prompt_dict(), "seq": i} for i, ln in enumerate(lines, start=start)]


_STYLE = (
    "You maintain the memory of a chat between a user and an assistant. Be factual and brief; "
    "never invent anything that is not in the input. Answer in the conversation's language."
)


def running_summary(lines: list[Line]) -> Prompt:
    return Prompt(
        name="running_summary",
        version="running-v2",
        system=_STYLE + " Summarise the current episode so far and list its open loops "
        "(unanswered questions, promises such as 'I will', to-dos).",
        input={"messages": numbered(lines)},
        response_model=RunningSummary,
    )


def chunk_summary(lines: list[Line]) -> Prompt:
    return Prompt(
        name="chunk_summary",
        version="chunk-v2",
        system=_STYLE + " Summarise this stretch of the conversation in a few sentences.",
        input={"messages": numbered(lines)},
        response_model=RunningSummary,
    )


def final_summary(lines: list[Line]) -> Prompt:
    return Prompt(
        name="final_summary",
        version="final-v2",
        system=_STYLE + " The episode is over: give its topic, a short label, a summary, decisions, "
        "to-dos, durable facts about the user worth remembering (preferences, identity, constraints; "
        "no greetings or small talk), named entities, shared files and open questions.",
        input={"messages": numbered(lines)},
        response_model=FinalSummary,
    )


def extract_facts(lines: list[Line]) -> Prompt:
    return Prompt(
        name="extract_facts",
        version="facts-v2",
        system=_STYLE + " From the user's messages, list durable facts about the user: identity (name, location, "
        "employer, occupation), preferences, constraints (allergies, things they never do), instructions to the "
        "assistant, and decisions. Skip greetings, small talk, questions and anything said with doubt. Give each "
        "fact the seq of its message, a short stable key, and a confidence (how explicitly it was stated).",
        input={"messages": numbered(lines)},
        response_model=FactList,
    )


def topic_shift(before: list[Line], window: list[Line]) -> Prompt:
    """Does `window[0]` (the candidate) open a new topic? `before`: the turns before it; `window`:
    the candidate and the turns after it seen so far (up to the next user turn)."""
    return Prompt(
        name="topic_shift",
        version="topic-shift-v2",
        system="You segment a chat between a user and an assistant into topics. Decide whether the candidate "
        "turn starts a new topic. First say in one sentence each what the turns before the candidate are "
        "about and what the candidate and the turns after it are about; then label the intent and topic of the "
        "candidate and of each turn after it; then deduce the answer from those: the candidate starts a new "
        "topic when it brings up a subject, task or question not being discussed before it (a new request, a "
        "change of subject, a greeting that opens a new conversation). A follow-up, an answer, a reaction or a "
        "clarification continues the topic, even when its words differ.",
        input={
            "before": numbered(before),
            "candidate_seq": len(before) + 1,
            "from_candidate": numbered(window, start=len(before) + 1),
        },
        response_model=TopicShift,
    )


def rollup_summary(texts: list[str]) -> Prompt:
    return Prompt(
        name="rollup_summary",
        version="rollup-v1",
        system=_STYLE + " Merge these summaries of consecutive parts of a conversation into one.",
        input={"summaries": texts},
        response_model=RollupSummary,
    )


def file_summary(filename: str | None, sections: list[str]) -> Prompt:
    return Prompt(
        name="file_summary",
        version="file-summary-v1",
        system=_STYLE + " A user shared this file in the chat. Say what it is and what it says.",
        input={"filename": filename or "", "sections": sections},
        response_model=FileSummary,
    )


def describe_video(ocr_text: str) -> Prompt:
    """Sent with a sheet of a video's pictures; the OCR text of all its pictures helps the model read them."""
    return Prompt(
        name="describe_video",
        version="describe-video-v1",
        system="These are pictures from one video that a user shared in a chat, taken at evenly spaced moments and "
        "tiled left to right, top to bottom. Describe the video, factually, for a memory that is searched later. "
        "Read any visible text exactly. Never guess at who people are.",
        input={"ocr_text": ocr_text},
        response_model=ImageDescription,
    )


def describe_image(ocr_text: str) -> Prompt:
    """Sent with the image itself; the OCR text helps the model read it."""
    return Prompt(
        name="describe_image",
        version="describe-image-v1",
        system="Describe this image that a user shared in a chat, factually, for a memory that is searched later. "
        "Read any visible text exactly. Never guess at who people are.",
        input={"ocr_text": ocr_text},
        response_model=ImageDescription,
    )
