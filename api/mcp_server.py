"""`chatmem mcp`: the memory as a Model Context Protocol server (the official `mcp` SDK), on stdio
or streamable HTTP. Every call is scoped to one user: the one the API key is bound to (HTTP) or
the one configured for the process (stdio); a tool argument can narrow that scope, never widen
it. Writes are events published fire-and-forget, like any bot's. See docs/mcp.md."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer, ResourceSecurity
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from chatmem.adapters.api_keys import ALL_USERS, KeyInfo
from chatmem.memory.recall import NotReadable
from chatmem.schemas.events import (
    CommandEvent,
    CommandName,
    InvalidEvent,
    MessageDeletedEvent,
    MessageEvent,
    describe_validation_error,
    validate_identifier,
)
from chatmem.schemas.read import ContextBundle, KnownAbout, RecallResult, Scope, SummaryView

if TYPE_CHECKING:
    from chatmem.bootstrap import Container
    from chatmem.producers.publisher import Publisher

API_KEY_HEADER = "X-API-Key"
MCP_PATH = "/mcp"
PLATFORM = "mcp"
MAX_EPISODE_MESSAGES = 200

ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def default_thread(user_id: str) -> str:
    """The thread add_memory writes to when none is given: one per user, only theirs."""
    return f"mcp:{user_id}"


# --- response shapes -------------------------------------------------------------------------
class Queued(BaseModel):
    """What add_memory and forget answer: the event is handed over, not yet processed."""

    event_id: str = Field(description="the event's id in the log; citations of what it becomes carry it")
    thread_id: str
    user_id: str
    status: Literal["queued"] = "queued"
    note: str = "processed in the background, usually within seconds; until then search_memory does not find it"


class EpisodeOverview(BaseModel):
    episode_id: str
    thread_id: str
    title: str | None = Field(None, description="the topic label, once the episode is summarized")
    status: str = Field(description="open (still going on) or closed")
    started_at: datetime | None = None
    ended_at: datetime | None = None
    summary: str | None = Field(None, description="the final summary when closed, else the running one")
    open_loops: list[str] = Field(default_factory=list, description="open questions, promises and to-dos")
    uri: str = Field(description="the episode as an MCP resource")


class EpisodeMessage(BaseModel):
    seq: int
    user_id: str
    role: str
    text: str
    occurred_at: datetime | None = None
    platform_message_id: str | None = None


class EpisodeDetail(EpisodeOverview):
    message_count: int
    messages: list[EpisodeMessage] = Field(description="the latest messages of the episode, oldest first")
    decisions: list[str] = Field(default_factory=list)


class EpisodeList(BaseModel):
    user_id: str
    episodes: list[EpisodeOverview]


def episode_uri(episode_id: str) -> str:
    thread_id, _, ordinal = episode_id.rpartition("#")
    return f"chatmem://threads/{thread_id}/episodes/{ordinal}"


def _summary_parts(summaries: list[dict[str, Any]]) -> tuple[str | None, list[str], list[str]]:
    """(summary text, open loops, decisions) from an episode's summaries: the final one if the
    episode is closed, else the latest running one."""
    final = next((s for s in summaries if s["kind"] == "final"), None)
    if final is not None:
        c = final["content"] or {}
        return final["text"], [*c.get("open_questions", []), *c.get("todos", [])], list(c.get("decisions", []))
    running = max((s for s in summaries if s["kind"] == "running"), key=lambda s: s["upto_seq"], default=None)
    if running is not None:
        return running["text"], list((running["content"] or {}).get("open_loops", [])), []
    return None, [], []


# --- scope -----------------------------------------------------------------------------------
class MemoryTools:
    """The tools, transport-free: `key` is the caller (a verified API key, or the stdio user as a
    one-user key). Raises ToolError with a message meant for the model."""

    def __init__(self, container: Container, publisher: Callable[[], Publisher]):
        self.c = container
        self._publisher = publisher
        self._publish_lock = threading.Lock()  # tools run on worker threads; one writer at a time

    # -- who and where
    def user(self, key: KeyInfo, requested: str | None) -> str:
        if requested is not None:
            user = _checked(requested, "user_id")
            if not key.allows(user):
                raise ToolError(f"this API key may not read user {user!r}")
            return user
        users = [u for u in key.user_ids if u != ALL_USERS]
        if ALL_USERS in key.user_ids:
            raise ToolError("this API key serves every user: pass user_id")
        if len(users) != 1:
            raise ToolError(f"this API key serves several users: pass user_id (one of {', '.join(users)})")
        return users[0]

    def readable_thread(self, user: str, thread_id: str) -> str:
        thread = _checked(thread_id, "thread_id")
        if not self.c.browser.readable_threads(user, thread):
            raise ToolError(f"thread {thread!r} not found for this user")
        return thread

    def writable_thread(self, user: str, thread_id: str | None) -> str:
        # Writing in a thread makes the writer a member, who may then read all of it: so only the
        # user's own MCP thread, or a thread they are already in.
        own = default_thread(user)
        if thread_id is None or thread_id == own:
            return _checked(own, "thread_id")
        return self.readable_thread(user, thread_id)

    def _episode(self, user: str, episode_id: str) -> dict[str, Any]:
        ep = self.c.browser.episode(_checked_episode(episode_id))
        if ep is None or not self.c.browser.readable_threads(user, ep["thread_id"]):
            raise ToolError(f"episode {episode_id!r} not found for this user")
        return ep

    # -- reads
    def search_memory(
        self, key: KeyInfo, query: str, scope: Scope, limit: int, thread_id: str | None, user_id: str | None
    ) -> RecallResult:
        user = self.user(key, user_id)
        thread = None if thread_id is None else _checked(thread_id, "thread_id")
        try:
            return self.c.recall(user, query, scope=scope, limit=limit, thread_id=thread)
        except NotReadable:
            raise ToolError(f"thread {thread_id!r} not found for this user") from None

    def get_context(
        self, key: KeyInfo, thread_id: str | None, query: str | None, max_tokens: int | None, user_id: str | None
    ) -> ContextBundle:
        user = self.user(key, user_id)
        if thread_id is None:
            threads = self.c.browser.threads_of(user)
            if not threads:
                raise ToolError("there is no memory for this user yet")
            thread = threads[0]["thread_id"]  # the one with the latest message
        else:
            thread = _checked(thread_id, "thread_id")
        try:
            return self.c.build_context(thread, user, query, max_tokens=max_tokens)
        except NotReadable:
            raise ToolError(f"thread {thread_id!r} not found for this user") from None

    def list_episodes(self, key: KeyInfo, thread_id: str | None, limit: int, user_id: str | None) -> EpisodeList:
        user = self.user(key, user_id)
        browser = self.c.browser
        if thread_id is None:
            rows = [{**r, "topic_label": r["title"]} for r in browser.recent_episodes(user, limit)]
        else:
            thread = self.readable_thread(user, thread_id)
            rows = [{**r, "thread_id": thread} for r in browser.episodes(thread)[::-1][:limit]]
        summaries = browser.episode_summaries([r["episode_id"] for r in rows])
        return EpisodeList(user_id=user, episodes=[_overview(r, summaries.get(r["episode_id"], [])) for r in rows])

    def get_episode(self, key: KeyInfo, episode_id: str, max_messages: int, user_id: str | None) -> EpisodeDetail:
        ep = self._episode(self.user(key, user_id), episode_id)
        _, _, decisions = _summary_parts(ep["summaries"])
        messages = ep["messages"]
        return EpisodeDetail(
            **_overview(ep, ep["summaries"]).model_dump(),
            message_count=len(messages),
            messages=[EpisodeMessage(**m) for m in messages[-max_messages:]] if max_messages else [],
            decisions=decisions,
        )

    def what_do_you_know(self, key: KeyInfo, user_id: str | None) -> KnownAbout:
        return self.c.what_do_you_know(self.user(key, user_id))

    def summaries(self, key: KeyInfo, thread_id: str, user_id: str | None) -> list[SummaryView]:
        user = self.user(key, user_id)
        return self.c.summaries(self.readable_thread(user, thread_id))

    # -- writes: events, fire-and-forget
    def add_memory(
        self, key: KeyInfo, text: str, kind: Literal["message", "remember"], thread_id: str | None, user_id: str | None
    ) -> Queued:
        user = self.user(key, user_id)
        thread = self.writable_thread(user, thread_id)
        if kind == "message":
            # Its own id is its platform id: delete_message can then name it.
            event_id = _new_event_id()
            return self._publish(
                MessageEvent, thread=thread, user=user, text=text, event_id=event_id, platform_message_id=event_id
            )
        return self._publish(CommandEvent, thread=thread, user=user, command=CommandName.REMEMBER, args={"text": text})

    def forget(self, key: KeyInfo, text: str, thread_id: str | None, user_id: str | None) -> Queued:
        user = self.user(key, user_id)
        thread = self.writable_thread(user, thread_id)
        return self._publish(CommandEvent, thread=thread, user=user, command=CommandName.FORGET, args={"text": text})

    def delete_message(self, key: KeyInfo, event_id: str, user_id: str | None) -> Queued:
        user = self.user(key, user_id)
        message_id = _checked(event_id, "event_id")
        logged = self.c.browser.logged_message(message_id)
        # Another user's message, or none: the same answer, which tells nothing of the other.
        if (
            logged is None
            or logged["user_id"] != user
            or not self.c.browser.readable_threads(user, logged["thread_id"])
        ):
            raise ToolError(f"no message {message_id!r} of this user")
        if not logged["platform_message_id"]:
            raise ToolError(
                "this message has no platform message id, so it cannot be deleted alone; "
                "an operator can erase the user's whole memory (chatmem erase)"
            )
        gone = [logged["platform_message_id"]]
        return self._publish(MessageDeletedEvent, thread=logged["thread_id"], user=user, platform_message_ids=gone)

    def _publish(
        self, kind: type[MessageEvent | MessageDeletedEvent | CommandEvent], *, thread: str, user: str, **fields: Any
    ) -> Queued:
        """The event built (what it refuses, the tool's error says) and published."""
        fields.setdefault("event_id", _new_event_id())
        try:
            event = kind(thread_id=thread, user_id=user, platform=PLATFORM, **fields)
        except ValidationError as error:
            raise ToolError(describe_validation_error(error)) from None
        with self._publish_lock:
            self._publisher().publish_nowait(event)
        return Queued(event_id=event.event_id, thread_id=event.thread_id, user_id=event.user_id)


def _new_event_id() -> str:
    return f"mcp-{uuid.uuid4().hex}"


def _overview(row: dict[str, Any], summaries: list[dict[str, Any]]) -> EpisodeOverview:
    summary, loops, _ = _summary_parts(summaries)
    return EpisodeOverview(
        episode_id=row["episode_id"],
        thread_id=row["thread_id"],
        title=row["topic_label"],
        status=row["status"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        summary=summary,
        open_loops=loops,
        uri=episode_uri(row["episode_id"]),
    )


def _checked(value: str, field: str) -> str:
    try:
        return validate_identifier(value, field)
    except InvalidEvent as error:
        raise ToolError(error.reason) from None


def _checked_episode(value: str) -> str:
    thread, _, ordinal = value.rpartition("#")
    if not ordinal.isdigit() or not thread:
        raise ToolError("episode_id: expected <thread_id>#<number>, as list_episodes gives it")
    _checked(thread, "episode_id")
    return value


# --- the server ------------------------------------------------------------------------------
INSTRUCTIONS = """\
Long-term memory of the user's conversations (chats with bots, imported history, and what was \
added here). Use search_memory to look something up before saying you do not know; quote its \
citations when you rely on a hit. Use get_context for a compact briefing on a conversation, \
list_episodes / get_episode to browse past topics, what_do_you_know for the user's known facts. \
add_memory stores a message or a fact the user wants kept; forget drops facts. Writes are \
processed in the background: they are not searchable for a few seconds."""

UserArg = Annotated[
    str | None,
    Field(
        description="Leave unset: the memory is the one your credentials are bound to. Needed only when the "
        "API key serves several users; it can never reach a user the key does not cover."
    ),
]
ThreadArg = Annotated[
    str | None,
    Field(description="A thread (one conversation) id, as shown in citations and list_episodes; unset: all threads."),
]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)


def create_server(tools: MemoryTools, caller: Callable[[Context], KeyInfo]) -> MCPServer:
    """The MCP server over `tools`; `caller` tells who is calling (the stdio user, or the API key
    of the HTTP request) and raises ToolError when nobody valid is."""
    mcp: MCPServer = MCPServer("chatmem", title="chatmem memory", instructions=INSTRUCTIONS, log_level="WARNING")

    @mcp.tool(annotations=READ_ONLY)
    def search_memory(
        ctx: Context,
        query: Annotated[str, Field(min_length=1, max_length=4000, description="What to look for, in plain words.")],
        scope: Annotated[
            Scope,
            Field(description="all (default), messages, summaries, facts, or artifacts (text from files and images)."),
        ] = Scope.ALL,
        limit: Annotated[int, Field(ge=1, le=50, description="How many hits to return.")] = 10,
        thread_id: ThreadArg = None,
        user_id: UserArg = None,
    ) -> RecallResult:
        """Search the user's long-term memory: past messages (archived ones too), conversation summaries,
        facts about the user, and text from files and images they sent. Hybrid keyword + meaning search.

        Each hit has a short snippet, the turns around it, and a citation: the thread, the episode, the
        message's position and its original platform message id and date. Use it whenever the user refers
        to something from before ("what did I say about...", "the restaurant we talked about") and cite
        what you use. No hits means memory holds nothing on it, not that it never happened."""
        return tools.search_memory(caller(ctx), query, scope, limit, thread_id, user_id)

    @mcp.tool(annotations=READ_ONLY)
    def get_context(
        ctx: Context,
        thread_id: Annotated[
            str | None,
            Field(description="The conversation to brief on; unset: the user's most recently active one."),
        ] = None,
        query: Annotated[
            str | None,
            Field(max_length=4000, description="The user's current request, to pull in relevant older snippets."),
        ] = None,
        max_tokens: Annotated[int | None, Field(ge=200, le=100_000, description="Token budget; default 8000.")] = None,
        user_id: UserArg = None,
    ) -> ContextBundle:
        """A compact, token-budgeted briefing on one conversation: its running summary and open loops,
        higher-level summaries of earlier parts, the most recent turns, the user's relevant facts, and
        older snippets relevant to `query`. Sections come in priority order, each item with its citation;
        `messages` is the same bundle as chat messages. Use it at the start of a task that continues an
        earlier conversation."""
        return tools.get_context(caller(ctx), thread_id, query, max_tokens, user_id)

    @mcp.tool(annotations=WRITE)
    def add_memory(
        ctx: Context,
        text: Annotated[str, Field(min_length=1, max_length=32_000, description="What to store, in the user's words.")],
        kind: Annotated[
            Literal["message", "remember"],
            Field(
                description="message: a message from the user, stored in the conversation like any chat turn; "
                "remember: an explicit fact to keep (e.g. 'I am vegetarian'), stored as a fact right away."
            ),
        ] = "message",
        thread_id: Annotated[
            str | None,
            Field(
                description="Unset (usual): the user's own MCP conversation. Otherwise a thread the user is already in."
            ),
        ] = None,
        user_id: UserArg = None,
    ) -> Queued:
        """Store something in the user's memory. Returns at once with the event id; the memory is built in
        the background (episodes, summaries, facts) and becomes searchable a few seconds later. Use
        kind="remember" when the user asks you to remember a fact or preference; use kind="message" to keep
        a note or a statement of theirs as part of the conversation history. Do not store your own replies
        or anything the user did not ask to keep."""
        return tools.add_memory(caller(ctx), text, kind, thread_id, user_id)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False))
    def delete_message(
        ctx: Context,
        event_id: Annotated[
            str,
            Field(max_length=128, description="The message's event_id: as add_memory returned it, or from a citation."),
        ],
        user_id: UserArg = None,
    ) -> Queued:
        """Delete one of the user's own messages from memory for good: its text, its edits, and what was
        derived from it (its facts go; summaries are rebuilt without it). Use it only when the user asks
        to delete something they said or stored, naming the message by the event_id that add_memory
        returned or that a search_memory citation gives. It cannot be undone. Processed in the
        background; returns at once."""
        return tools.delete_message(caller(ctx), event_id, user_id)

    @mcp.tool(annotations=READ_ONLY)
    def list_episodes(
        ctx: Context,
        thread_id: ThreadArg = None,
        limit: Annotated[int, Field(ge=1, le=100, description="How many episodes, newest first.")] = 10,
        user_id: UserArg = None,
    ) -> EpisodeList:
        """The user's recent episodes (chapters of their conversations, one topic each), newest first:
        title, status, time span, summary and open loops (unanswered questions, to-dos). Use it to see what
        the user has been talking about, then get_episode for one of them."""
        return tools.list_episodes(caller(ctx), thread_id, limit, user_id)

    @mcp.tool(annotations=READ_ONLY)
    def get_episode(
        ctx: Context,
        episode_id: Annotated[
            str, Field(max_length=200, description="As list_episodes or a citation gives it: <thread_id>#<number>.")
        ],
        max_messages: Annotated[
            int, Field(ge=0, le=MAX_EPISODE_MESSAGES, description="How many of its latest messages to include.")
        ] = 50,
        user_id: UserArg = None,
    ) -> EpisodeDetail:
        """One episode in full: title, time span, summary, open loops, decisions, and its messages (the
        latest `max_messages`, oldest first, with who said them)."""
        return tools.get_episode(caller(ctx), episode_id, max_messages, user_id)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False))
    def forget(
        ctx: Context,
        text: Annotated[
            str, Field(min_length=1, max_length=2000, description="What to forget, e.g. 'my address', 'coffee'.")
        ],
        thread_id: Annotated[
            str | None, Field(description="Unset (usual): the user's own MCP conversation records the request.")
        ] = None,
        user_id: UserArg = None,
    ) -> Queued:
        """Forget facts about the user that match `text` (they are archived and no longer used or found as
        facts). Use it only when the user asks to forget something. It does not delete conversation history.
        Processed in the background; returns the event id at once."""
        return tools.forget(caller(ctx), text, thread_id, user_id)

    @mcp.tool(annotations=READ_ONLY)
    def what_do_you_know(ctx: Context, user_id: UserArg = None) -> KnownAbout:
        """Everything memory holds about the user at a glance: their active facts (preferences, identity,
        constraints, decisions, with confidence) and the titles of their latest conversation episodes. Use
        it when the user asks what you know or remember about them."""
        return tools.what_do_you_know(caller(ctx), user_id)

    # Resources: the same reads, addressed by URI. Ids are checked by our own validators (they never
    # touch a file system), so the SDK's path checks are off for them.
    ids = ResourceSecurity(exempt_params={"thread_id", "ordinal", "user_id"})

    @mcp.resource(
        "chatmem://episodes{?user_id}",
        name="recent-episodes",
        description="The user's latest episodes with title, summary, open loops and time span.",
        mime_type="application/json",
        security=ids,
    )
    def recent_episodes_resource(ctx: Context, user_id: str | None = None) -> str:
        return _resource(lambda key: tools.list_episodes(key, None, 20, user_id), caller, ctx)

    @mcp.resource(
        "chatmem://threads/{thread_id}/episodes/{ordinal}{?user_id}",
        name="episode",
        description="One episode: title, summary, open loops, decisions, time span and its latest messages.",
        mime_type="application/json",
        security=ids,
    )
    def episode_resource(ctx: Context, thread_id: str, ordinal: str, user_id: str | None = None) -> str:
        return _resource(lambda key: tools.get_episode(key, f"{thread_id}#{ordinal}", 50, user_id), caller, ctx)

    @mcp.resource(
        "chatmem://threads/{thread_id}/summaries{?user_id}",
        name="thread-summaries",
        description="A conversation's active summaries, highest level first: roll-ups, finals, the running one.",
        mime_type="application/json",
        security=ids,
    )
    def summaries_resource(ctx: Context, thread_id: str, user_id: str | None = None) -> str:
        return _resource(lambda key: tools.summaries(key, thread_id, user_id), caller, ctx)

    return mcp


_SUMMARIES = TypeAdapter(list[SummaryView])


def _resource(read: Callable[[KeyInfo], Any], caller: Callable[[Context], KeyInfo], ctx: Context) -> str:
    try:
        result = read(caller(ctx))
    except ToolError as error:  # not found, or not this caller's: the same answer
        raise ResourceNotFoundError(str(error)) from None
    if isinstance(result, BaseModel):
        return result.model_dump_json(indent=1)
    return _SUMMARIES.dump_json(result, indent=1).decode()


# --- transports ------------------------------------------------------------------------------
def stdio_caller(user_id: str) -> Callable[[Context], KeyInfo]:
    """On stdio the process serves one user, fixed at start."""
    key = KeyInfo("stdio", (validate_identifier(user_id, "user_id"),))
    return lambda _ctx: key


def api_key_from(headers: Any) -> str | None:
    """X-API-Key, or `Authorization: Bearer <key>` for clients that only send bearer tokens."""
    if headers is None:
        return None
    key = headers.get(API_KEY_HEADER.lower()) or headers.get(API_KEY_HEADER)
    if key:
        return str(key)
    auth = headers.get("authorization") or headers.get("Authorization") or ""
    scheme, _, token = str(auth).partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def http_caller(container: Container) -> Callable[[Context], KeyInfo]:
    """Each request's own key, verified on each call: a revoked key stops at once, and a session
    id carries no rights of its own."""

    def caller(ctx: Context) -> KeyInfo:
        token = api_key_from(ctx.headers)
        key = container.api_keys.verify(token) if token else None
        if key is None:
            raise ToolError(f"send a valid API key in the {API_KEY_HEADER} header")
        return key

    return caller


def require_api_key(app: ASGIApp, container: Container) -> ASGIApp:
    """Refuse HTTP requests without a valid key before the MCP layer sees them (401, JSON)."""

    async def guarded(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = api_key_from(headers)
        key = await anyio.to_thread.run_sync(container.api_keys.verify, token) if token else None
        if key is None:
            error = "missing_api_key" if not token else "invalid_api_key"
            body = json.dumps({"error": error, "detail": f"send a valid API key in the {API_KEY_HEADER} header"})
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        await app(scope, receive, send)

    return guarded


def run_stdio(container: Container, user_id: str) -> None:
    tools = MemoryTools(container, _lazy_publisher(container))
    create_server(tools, stdio_caller(user_id)).run("stdio")


def http_app(container: Container, host: str) -> ASGIApp:
    """The streamable HTTP app at /mcp, behind the API key check."""
    tools = MemoryTools(container, _lazy_publisher(container))
    server = create_server(tools, http_caller(container))
    return require_api_key(server.streamable_http_app(streamable_http_path=MCP_PATH, host=host), container)


def run_http(app: ASGIApp, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning")


def _lazy_publisher(container: Container) -> Callable[[], Publisher]:
    """The fire-and-forget publisher, started on the first write (a read-only session never
    starts its flusher process)."""
    from functools import cache

    from chatmem.producers.publisher import Publisher

    return cache(lambda: Publisher.from_settings(container.settings, container.urls.redis_url))
