"""`recall_memory` as an OpenAI function-calling tool: the schema to offer the model and an
executor for the calls it makes. The user and thread come from the bot, never from the model's
arguments, so a model cannot widen its own scope."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chatmem.memory.recall import NotReadable, Recall
from chatmem.schemas.read import RecallHit, RecallResult, Scope

TOOL_NAME = "recall_memory"


class RecallArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=1000, description="What to look for, in plain words.")
    scope: Scope = Field(Scope.ALL, description="Where to look.")
    limit: int = Field(8, ge=1, le=25, description="How many results at most.")


def tool_definition() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Search the long-term memory of this conversation and of what the user told you before: "
                "earlier messages (also archived ones), summaries, facts about the user. Returns snippets, "
                "each with a citation [n] naming where it was said."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for, in plain words."},
                    "scope": {
                        "type": "string",
                        "enum": [s.value for s in Scope],
                        "description": "all (default), summaries, messages, facts or artifacts.",
                    },
                    "limit": {"type": "integer", "minimum": 1, "maximum": 25, "description": "At most this many."},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


@dataclass(frozen=True)
class ToolOutput:
    content: str  # what goes back to the model as the tool message
    result: RecallResult | None
    error: str | None = None

    def tool_message(self, tool_call_id: str) -> dict[str, str]:
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content}


def execute(recall: Recall, arguments: str | dict, *, user_id: str, thread_id: str | None = None) -> ToolOutput:
    """Run one tool call. Bad arguments come back as an error the model can read and correct."""
    try:
        raw = json.loads(arguments) if isinstance(arguments, str) else arguments
        args = RecallArgs.model_validate(raw)
    except (json.JSONDecodeError, ValidationError, TypeError) as error:
        message = f"recall_memory: invalid arguments: {_short(error)}"
        return ToolOutput(content=message, result=None, error=message)
    try:
        result = recall(user_id, args.query, scope=args.scope, limit=args.limit, thread_id=thread_id)
    except NotReadable:
        message = "recall_memory: this conversation's memory is not available"
        return ToolOutput(content=message, result=None, error=message)
    return ToolOutput(content=format_hits(result), result=result)


def format_hits(result: RecallResult) -> str:
    if not result.hits:
        return f'No memory found for "{result.query}".'
    return "\n".join(_line(n, h) for n, h in enumerate(result.hits, 1))


def _line(n: int, h: RecallHit) -> str:
    c = h.citation
    when = c.occurred_at.strftime("%Y-%m-%d %H:%M") if c.occurred_at else None
    where = [f"thread {c.thread_id}"]
    if c.platform_message_id:
        where.append(f"message {c.platform_message_id}")
    elif c.seq is not None:
        where.append(f"#{c.seq}" + (f"-{c.upto_seq}" if c.upto_seq is not None else ""))
    head = " · ".join(x for x in (h.kind, when, h.author, ", ".join(where)) if x)
    text = f"[{n}] ({head}) {h.snippet}"
    if h.before:
        text += f"\n    before: {h.before}"
    if h.after:
        text += f"\n    after: {h.after}"
    return text


def _short(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors())
    return str(error)
