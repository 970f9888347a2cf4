"""A local stand-in for the Telegram Bot API, enough for python-telegram-bot and aiogram to run
their real polling loops against it: getMe, getUpdates (a queue the test pushes to; offset,
timeout, limit and allowed_updates honoured), sendMessage (recorded; answers a Message with a
new message_id), setMyCommands, deleteWebhook, getFile and the file download path
/file/bot<token>/<file_path>. sendMessage with a business_connection_id answers as Telegram does
for a connected business bot: the message is the business owner's (`business_owners`), sent by
the bot. It runs aiohttp on its own thread and loop, so a test can push updates from anywhere."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass
class StubFile:
    data: bytes
    path: str
    too_big: bool = False


def _decoded(value: Any) -> Any:
    """Bot API clients send objects and lists as JSON strings inside forms."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class TelegramStub:
    def __init__(self, token: str, *, bot_id: int = 7_000_001, username: str = "memo_bot"):
        self.token = token
        self.me = {"id": bot_id, "is_bot": True, "first_name": "Memo", "username": username}
        self.updates: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.sent: list[dict[str, Any]] = []
        self.files: dict[str, StubFile] = {}
        self.get_file_failures: list[int] = []  # statuses the next getFile calls answer with
        self.allowed_updates: list[str] | None = None
        self.business_owners: dict[str, dict[str, Any]] = {}  # connection id -> the account's owner
        self.confirmed = 0  # the highest offset a client has confirmed
        self._messages: dict[tuple[int, int], dict[str, Any]] = {}
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(9001)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._new_update: asyncio.Event | None = None
        self._closing = False
        self.url = ""

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> TelegramStub:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="telegram-stub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Telegram stub did not start")
        return self

    async def _serve(self) -> None:
        self._new_update = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        # No access log: request paths carry the token, and tests assert it is logged nowhere.
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        async def shutdown() -> None:
            self._closing = True
            assert self._new_update is not None
            self._new_update.set()
            if self._runner is not None:
                await self._runner.cleanup()

        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> TelegramStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what tests call ----------------------------------------------------------------------
    def push(self, update: dict[str, Any]) -> int:
        """Queue an update (its update_id is assigned here); returns the update_id."""
        with self._lock:
            update = {**update, "update_id": next(self._update_ids)}
            self.updates.append(update)
            for key in ("message", "edited_message", "channel_post", "edited_channel_post", "business_message"):
                if message := update.get(key):
                    self._messages[(message["chat"]["id"], message["message_id"])] = message
        if self._new_update is not None:
            self._loop.call_soon_threadsafe(self._new_update.set)
        return update["update_id"]

    def add_file(self, file_id: str, data: bytes, path: str | None = None, *, too_big: bool = False) -> None:
        self.files[file_id] = StubFile(data, path or f"documents/{file_id}.bin", too_big)

    def methods(self) -> list[str]:
        with self._lock:
            return [m for m, _ in self.calls]

    def wait_sent(self, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.sent) >= count:
                    return list(self.sent)
            time.sleep(0.02)
        raise AssertionError(f"the bot sent {len(self.sent)} messages, expected {count}")

    # --- the API ------------------------------------------------------------------------------
    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            params.update(await request.json())
        elif request.can_read_body:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
        return {k: _decoded(v) for k, v in params.items()}

    @staticmethod
    def _ok(result: Any) -> web.Response:
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    def _error(status: int, description: str) -> web.Response:
        return web.json_response({"ok": False, "error_code": status, "description": description}, status=status)

    async def _api(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        method = request.match_info["method"]
        params = await self._params(request)
        with self._lock:
            self.calls.append((method, params))
        handler = getattr(self, f"_m_{method.lower()}", None)
        if handler is None:
            return self._error(404, "Not Found: method not found")
        return await handler(params)

    async def _m_getme(self, params: dict[str, Any]) -> web.Response:
        return self._ok(self.me)

    async def _m_deletewebhook(self, params: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_setmycommands(self, params: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_close(self, params: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_getupdates(self, params: dict[str, Any]) -> web.Response:
        offset = int(params.get("offset") or 0)
        limit = int(params.get("limit") or 100)
        timeout = min(float(params.get("timeout") or 0), 5.0)
        if isinstance(params.get("allowed_updates"), list):
            self.allowed_updates = params["allowed_updates"] or None
        assert self._new_update is not None
        deadline = self._loop.time() + timeout
        while True:
            self._new_update.clear()
            with self._lock:
                self.confirmed = max(self.confirmed, offset)
                pending = [u for u in self.updates if u["update_id"] >= offset and self._allowed(u)]
            remaining = deadline - self._loop.time()
            if pending or remaining <= 0 or self._closing:
                return self._ok(pending[:limit])
            try:
                await asyncio.wait_for(self._new_update.wait(), remaining)
            except TimeoutError:
                pass

    def _allowed(self, update: dict[str, Any]) -> bool:
        # Telegram does not even create updates of types the bot did not ask for.
        kinds = [k for k in update if k != "update_id"]
        return self.allowed_updates is None or any(k in self.allowed_updates for k in kinds)

    async def _m_sendmessage(self, params: dict[str, Any]) -> web.Response:
        chat_id = int(params["chat_id"])
        with self._lock:
            chat = next((m["chat"] for (c, _), m in self._messages.items() if c == chat_id), None)
            message: dict[str, Any] = {
                "message_id": next(self._message_ids),
                "date": int(time.time()),
                "chat": chat or {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
                "from": self.me,
                "text": str(params["text"]),
            }
            if params.get("message_thread_id"):
                message["message_thread_id"] = int(params["message_thread_id"])
                message["is_topic_message"] = True
            if connection := params.get("business_connection_id"):
                message["business_connection_id"] = connection
                message["from"] = self.business_owners[connection]
                message["sender_business_bot"] = self.me
            reply = params.get("reply_parameters") or {}
            reply_id = reply.get("message_id") if isinstance(reply, dict) else None
            reply_id = reply_id or params.get("reply_to_message_id")
            if reply_id:
                replied = self._messages.get((chat_id, int(reply_id)))
                message["reply_to_message"] = replied or {
                    "message_id": int(reply_id),
                    "date": message["date"],
                    "chat": message["chat"],
                }
            self._messages[(chat_id, message["message_id"])] = message
            self.sent.append(message)
        return self._ok(message)

    async def _m_getbusinessconnection(self, params: dict[str, Any]) -> web.Response:
        connection = str(params.get("business_connection_id"))
        owner = self.business_owners.get(connection)
        if owner is None:
            return self._error(400, "Bad Request: business connection not found")
        return self._ok(
            {
                "id": connection,
                "user": owner,
                "user_chat_id": owner["id"],
                "date": T0,
                "is_enabled": True,
                "rights": {"can_reply": True},
            }
        )

    async def _m_deletemessage(self, params: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_deletemessages(self, params: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_getfile(self, params: dict[str, Any]) -> web.Response:
        if self.get_file_failures:
            status = self.get_file_failures.pop(0)
            return self._error(status, "Too Many Requests: retry after 1" if status == 429 else "Internal Server Error")
        stub = self.files.get(str(params.get("file_id")))
        if stub is None:
            return self._error(400, "Bad Request: invalid file_id")
        if stub.too_big:
            return self._error(400, "Bad Request: file is too big")
        return self._ok(
            {
                "file_id": params["file_id"],
                "file_unique_id": f"u{params['file_id']}",
                "file_size": len(stub.data),
                "file_path": stub.path,
            }
        )

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        path = request.match_info["path"]
        for stub in self.files.values():
            if stub.path == path:
                return web.Response(body=stub.data)
        return web.Response(status=404)


# --- Bot API objects for tests ------------------------------------------------------------------
T0 = 1_767_261_600  # 2026-01-01 10:00 UTC
ALICE = {"id": 111, "is_bot": False, "first_name": "Alice", "last_name": "Liddell", "username": "alice"}
BOB = {"id": 222, "is_bot": False, "first_name": "Bob"}
PRIVATE = {"id": 111, "type": "private", "first_name": "Alice", "username": "alice"}
GROUP = {"id": -1001234567890, "type": "supergroup", "title": "Garden club"}
FORUM = {"id": -1009876543210, "type": "supergroup", "title": "Projects", "is_forum": True}
BASIC_GROUP = {"id": -4001, "type": "group", "title": "Family"}
CHANNEL = {"id": -1005550001111, "type": "channel", "title": "News"}


def message(
    chat: dict[str, Any], message_id: int, *, user: dict[str, Any] | None = ALICE, date: int = T0, **fields: Any
):
    """A Bot API Message dict."""
    out: dict[str, Any] = {"message_id": message_id, "date": date, "chat": chat}
    if user is not None:
        out["from"] = user
    out.update(fields)
    return out


def photo_sizes(prefix: str) -> list[dict[str, Any]]:
    return [
        {"file_id": f"{prefix}-s", "file_unique_id": f"{prefix}s", "width": 90, "height": 60, "file_size": 1_000},
        {"file_id": f"{prefix}-x", "file_unique_id": f"{prefix}x", "width": 1280, "height": 853, "file_size": 90_000},
        {"file_id": f"{prefix}-m", "file_unique_id": f"{prefix}m", "width": 320, "height": 213, "file_size": 9_000},
    ]


# A business account (Telegram Business) with the bot connected to it; Alice writes to it, so
# its chat with her has her user id, as her private chat with the bot does.
OWNER = {"id": 444, "is_bot": False, "first_name": "Olga", "last_name": "Florist"}
CONNECTION = "bc-olga-0001"


def business(message_dict: dict[str, Any], connection: str = CONNECTION) -> dict[str, Any]:
    """A message of a business chat, as business_message and edited_business_message carry it."""
    return {**message_dict, "business_connection_id": connection}
