"""A real discord.py bot without Discord: gateway payloads (READY, GUILD_CREATE, MESSAGE_CREATE,
MESSAGE_UPDATE, INTERACTION_CREATE) go through discord.py's own parsers and event dispatch, and
its HTTP calls (login, interaction responses, follow-ups, sent messages) reach a local aiohttp
server that stands in for the REST API (`discord.http.Route.BASE` points at it). Payloads are
shaped like the gateway's (https://discord.com/developers/docs/topics/gateway-events)."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import discord
from aiohttp import web
from discord.ext import commands
from discord.http import Route

TOKEN = "test-bot-token"
T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
# Snowflake-sized ids (Discord's mention syntax only matches 15-20 digits).
APP_ID = 1_090_000_000_000_000_000
BOT_ID = 1_090_000_000_000_000_001
GUILD_ID = 1_070_000_000_000_000_000
CHANNEL_ID = 1_071_000_000_000_000_000  # a text channel
THREAD_ID = 1_072_000_000_000_000_000  # a Discord thread under CHANNEL_ID
DM_ID = 1_073_000_000_000_000_000  # the DM channel between the bot and ALICE
ALICE = 1_050_000_000_000_000_001
BOB = 1_050_000_000_000_000_002

_minutes = itertools.count(1)
_low_bits = itertools.count(1)


def snowflake(at: datetime | None = None) -> int:
    """A snowflake for `at`, or for the next minute after T0 (distinct, increasing)."""
    when = at or T0 + timedelta(minutes=next(_minutes))
    return discord.utils.time_snowflake(when) + next(_low_bits) % 4096


def iso(at: datetime) -> str:
    return at.isoformat()


def user(uid: int, name: str, *, global_name: str | None = None, bot: bool = False) -> dict[str, Any]:
    return {
        "id": str(uid),
        "username": name,
        "discriminator": "0",
        "global_name": global_name,
        "avatar": None,
        "bot": bot,
    }


BOT_USER = user(BOT_ID, "chatmem_bot", global_name="Chatmem", bot=True)
USERS = {ALICE: user(ALICE, "alice", global_name="Alice A."), BOB: user(BOB, "bob")}


def member(nick: str | None = None) -> dict[str, Any]:
    return {
        "roles": [],
        "joined_at": iso(T0 - timedelta(days=30)),
        "deaf": False,
        "mute": False,
        "nick": nick,
        "flags": 0,
    }


def text_channel(cid: int = CHANNEL_ID, name: str = "general") -> dict[str, Any]:
    return {
        "id": str(cid),
        "type": 0,
        "guild_id": str(GUILD_ID),
        "name": name,
        "position": 0,
        "permission_overwrites": [],
        "nsfw": False,
        "parent_id": None,
        "topic": None,
        "last_message_id": None,
        "rate_limit_per_user": 0,
    }


def thread_channel(tid: int = THREAD_ID, parent: int = CHANNEL_ID, name: str = "trip-planning") -> dict[str, Any]:
    return {
        "id": str(tid),
        "type": 11,  # public thread
        "guild_id": str(GUILD_ID),
        "parent_id": str(parent),
        "owner_id": str(ALICE),
        "name": name,
        "last_message_id": None,
        "message_count": 0,
        "member_count": 1,
        "rate_limit_per_user": 0,
        "thread_metadata": {
            "archived": False,
            "auto_archive_duration": 1440,
            "archive_timestamp": iso(T0),
            "locked": False,
        },
    }


def dm_channel(cid: int = DM_ID, recipient: int = ALICE) -> dict[str, Any]:
    return {"id": str(cid), "type": 1, "recipients": [USERS[recipient]], "last_message_id": None}


def ready() -> dict[str, Any]:
    return {
        "v": 10,
        "user": BOT_USER,
        "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
        "session_id": "s1",
        "resume_gateway_url": "wss://gateway.invalid",
        "application": {"id": str(APP_ID), "flags": 0},
    }


def guild_create() -> dict[str, Any]:
    return {
        "id": str(GUILD_ID),
        "name": "Test guild",
        "unavailable": False,
        "member_count": 3,
        "owner_id": str(ALICE),
        "roles": [
            {
                "id": str(GUILD_ID),
                "name": "@everyone",
                "permissions": "1024",
                "position": 0,
                "color": 0,
                "hoist": False,
                "managed": False,
                "mentionable": False,
            }
        ],
        "channels": [text_channel()],
        "threads": [thread_channel()],
        "members": [],
        "emojis": [],
        "stickers": [],
        "features": [],
    }


def message(
    author: int,
    content: str = "",
    *,
    channel: int = CHANNEL_ID,
    guild: bool = True,
    mid: int | None = None,
    nick: str | None = None,
    reply_to: int | None = None,
    attachments: list[dict[str, Any]] | None = None,
    embeds: list[dict[str, Any]] | None = None,
    stickers: list[dict[str, Any]] | None = None,
    mentions: list[dict[str, Any]] | None = None,
    edited: datetime | None = None,
    type: int = 0,
) -> dict[str, Any]:
    """A MESSAGE_CREATE / MESSAGE_UPDATE payload."""
    mid = mid or snowflake()
    data: dict[str, Any] = {
        "id": str(mid),
        "channel_id": str(channel),
        "author": BOT_USER if author == BOT_ID else USERS[author],
        "content": content,
        "timestamp": iso(discord.utils.snowflake_time(mid)),
        "edited_timestamp": iso(edited) if edited else None,
        "tts": False,
        "mention_everyone": False,
        "mentions": mentions or [],
        "mention_roles": [],
        "attachments": attachments or [],
        "embeds": embeds or [],
        "pinned": False,
        "type": 19 if reply_to and type == 0 else type,
        "flags": 0,
    }
    if guild:
        data["guild_id"] = str(GUILD_ID)
        data["member"] = member(nick)
    if stickers:
        data["sticker_items"] = stickers
    if reply_to:
        data["message_reference"] = {
            "type": 0,
            "message_id": str(reply_to),
            "channel_id": str(channel),
            **({"guild_id": str(GUILD_ID)} if guild else {}),
        }
    return data


def cdn_attachment(aid: int, filename: str, content_type: str | None, size: int, channel: int = CHANNEL_ID) -> dict:
    url = f"https://cdn.discordapp.com/attachments/{channel}/{aid}/{filename}?ex=67a&is=679&hm=abc"
    data: dict[str, Any] = {"id": str(aid), "filename": filename, "size": size, "url": url, "proxy_url": url}
    if content_type:
        data["content_type"] = content_type
    return data


def slash(
    name: str,
    author: int = ALICE,
    options: dict[str, str] | None = None,
    *,
    channel: int = CHANNEL_ID,
    guild: bool = True,
    iid: int | None = None,
) -> dict[str, Any]:
    """An INTERACTION_CREATE payload for a chat-input (slash) command."""
    data: dict[str, Any] = {
        "id": str(iid or snowflake()),
        "application_id": str(APP_ID),
        "type": 2,
        "token": f"itoken-{name}",
        "version": 1,
        "attachment_size_limit": 8 << 20,
        "data": {
            "id": str(snowflake(T0)),
            "name": name,
            "type": 1,
            "options": [{"name": k, "type": 3, "value": v} for k, v in (options or {}).items()],
        },
        "locale": "en-US",
        "app_permissions": "0",
        "entitlements": [],
    }
    if guild:
        data |= {
            "guild_id": str(GUILD_ID),
            "channel_id": str(channel),
            "channel": thread_channel() if channel == THREAD_ID else text_channel(channel),
            "member": {**member(), "user": USERS[author], "permissions": "1024"},
            "authorizing_integration_owners": {"0": str(GUILD_ID)},
            "context": 0,
        }
    else:
        data |= {
            "channel_id": str(channel),
            "channel": dm_channel(channel, author),
            "user": USERS[author],
            "authorizing_integration_owners": {"0": str(GUILD_ID)},
            "context": 1,
        }
    return data


def _json(data: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", as Discord sends it: discord.py reads anything else as text.
    return web.Response(body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"})


@dataclass
class Request:
    method: str
    path: str  # without the /api/v10 prefix
    body: Any


@dataclass
class FakeDiscordAPI:
    """The REST endpoints the bot calls, answered like Discord answers them; every request is
    recorded."""

    requests: list[Request] = field(default_factory=list)
    base: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v10/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}/api/v10"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bot {TOKEN}" and not request.path.startswith(
            ("/api/v10/interactions/", "/api/v10/webhooks/")
        ):
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        path = "/" + request.match_info["tail"]
        raw = await request.read()
        body = json.loads(raw) if raw and request.content_type == "application/json" else None
        self.requests.append(Request(request.method, path, body))
        parts = path.strip("/").split("/")
        if request.method == "GET" and path == "/users/@me":
            return _json(BOT_USER)
        if request.method == "GET" and path == "/oauth2/applications/@me":
            return _json(
                {
                    "id": str(APP_ID),
                    "name": "chatmem test",
                    "description": "",
                    "icon": None,
                    "bot_public": False,
                    "bot_require_code_grant": False,
                    "owner": USERS[ALICE],
                    "verify_key": "00",
                    "flags": 0,
                }
            )
        if request.method == "POST" and parts[0] == "interactions" and parts[-1] == "callback":
            flags = ((body or {}).get("data") or {}).get("flags", 0)
            return _json({"interaction": {"id": parts[1], "type": 2, "response_message_ephemeral": bool(flags & 64)}})
        if request.method == "POST" and parts[0] == "webhooks":  # an interaction's follow-up
            return _json(self._sent(int(parts[1]), body or {}, webhook=True))
        if request.method == "POST" and parts[0] == "channels" and parts[-1] == "typing":
            return web.Response(status=204)
        if request.method == "POST" and parts[0] == "channels" and parts[-1] == "messages":
            return _json(self._sent(int(parts[1]), body or {}))
        return _json({"message": "404: Not Found", "code": 0}, status=404)

    def _sent(self, channel: int, body: dict[str, Any], *, webhook: bool = False) -> dict[str, Any]:
        data = message(BOT_ID, body.get("content") or "", channel=channel if not webhook else CHANNEL_ID)
        data["flags"] = body.get("flags", 0)
        if webhook:
            data["webhook_id"] = str(APP_ID)
        return data

    def posted(self, prefix: str) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.path.startswith(prefix)]


def offline_bot() -> commands.Bot:
    """A bot whose cache knows the test guild, its channel and thread, for building discord.py
    objects with discord.py's constructors (no event loop, no HTTP)."""
    intents = discord.Intents.default()
    intents.message_content = True
    bot = commands.Bot(command_prefix="!", intents=intents)
    state = bot._connection
    state.user = discord.ClientUser(state=state, data=BOT_USER)  # type: ignore[arg-type]  # what READY does
    state._add_guild_from_data(guild_create())  # type: ignore[arg-type]
    return bot


def to_message(bot: commands.Bot, data: dict[str, Any]) -> discord.Message:
    """The Message that MESSAGE_CREATE / MESSAGE_UPDATE builds, without the dispatch."""
    state = bot._connection
    channel, _ = state._get_guild_channel(data)  # type: ignore[arg-type]
    return discord.Message(state=state, channel=channel, data=data)  # type: ignore[arg-type]


class DiscordHarness:
    """`async with DiscordHarness() as h:` a logged-in `commands.Bot` (real login against the
    stand-in API, READY and GUILD_CREATE parsed), no gateway connection."""

    def __init__(self) -> None:
        self.api = FakeDiscordAPI()
        intents = discord.Intents.default()
        intents.message_content = True
        self.bot = commands.Bot(command_prefix="!", intents=intents, guild_ready_timeout=0.01)
        self._base = Route.BASE

    async def __aenter__(self) -> DiscordHarness:
        await self.api.start()
        Route.BASE = self.api.base
        await self.bot.login(TOKEN)
        self.gateway("READY", ready())
        self.gateway("GUILD_CREATE", guild_create())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.settle()
            await self.bot.close()
        finally:
            Route.BASE = self._base
            await self.api.stop()

    def gateway(self, event: str, data: dict[str, Any]) -> None:
        """One gateway dispatch, parsed by discord.py as if it came over the websocket."""
        self.bot._connection.parsers[event](data)

    async def send(self, event: str, data: dict[str, Any]) -> None:
        self.gateway(event, data)
        await self.settle()

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait for the listeners and command callbacks the dispatches started."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pending = [
                t
                for t in asyncio.all_tasks()
                if not t.done() and t.get_name().startswith(("discord.py: ", "CommandTree-invoker"))
            ]
            if not pending:
                return
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"listeners still running: {[t.get_name() for t in pending]}")
            await asyncio.wait(pending, timeout=left)
