"""Memory for a python-telegram-bot (v22) bot:

    application = Application.builder().token(TOKEN).build()
    telegram_ptb.add_memory(application, publisher, memory=open_memory())

`add_memory` registers a TypeHandler in a negative group, so it sees every update before the
bot's own handlers, which still run: each message, edit and memory command is published
fire-and-forget (`publish_nowait` only writes to a pipe). It also wraps the bot's request object
(PTB's `BaseRequest`, its documented networking extension point): every Bot API answer passes
through it, so each message the bot sends, whichever helper sent it, is published as an
`assistant` message. The mapping itself is producers/telegram.py, shared with aiogram.
"""

from __future__ import annotations

import json
from typing import Any

from telegram import Bot, ReplyParameters, Update
from telegram.ext import Application, ApplicationHandlerStop, CallbackContext, TypeHandler
from telegram.request import BaseRequest, RequestData

from chatmem.adapters.fetch import install_token_filter
from chatmem.producers import telegram
from chatmem.producers.chat import MemoryView
from chatmem.producers.telegram import EventPublisher, Incoming

# Importing this module protects the logs before the bot object exists: python-telegram-bot logs
# its base URL, token included, when the bot is built, and httpx logs every request URL.
install_token_filter()

# Runs before the default group 0; a bot may pick another negative group.
DEFAULT_GROUP = -100
# Bot API methods whose answer can be a Message (sendMessage, sendPhoto, editMessageText,
# forwardMessage, stopMessageLiveLocation ...); the others are not parsed.
_MESSAGE_METHOD_PREFIXES = ("send", "edit", "forward", "stop")

AnyApplication = Application[Any, Any, Any, Any, Any, Any]


def add_memory(
    application: AnyApplication,
    publisher: EventPublisher,
    memory: MemoryView | None = None,
    *,
    answer_commands: bool = True,
    record_replies: bool = True,
    group: int = DEFAULT_GROUP,
) -> None:
    """Publish what the bot receives and sends. With `answer_commands` the memory commands
    (/remember, /forget, /summary, /newtopic, /memory_off, /memory_on, /whatdoyouknow) are
    answered here and not passed on to the bot's handlers; `memory` (e.g. `open_memory()`)
    lets /whatdoyouknow and /summary read memory. Call before `application.initialize()`."""
    install_token_filter()  # PTB logs URLs (httpx at INFO, its base URL at DEBUG): they hold the token
    if record_replies:
        record_bot_messages(application.bot, publisher)
    application.add_handler(TypeHandler(Update, _MemoryHandler(publisher, memory, answer_commands)), group=group)


class _MemoryHandler:
    def __init__(self, publisher: EventPublisher, memory: MemoryView | None, answer_commands: bool):
        self.publisher = publisher
        self.memory = memory
        self.answer_commands = answer_commands

    async def __call__(self, update: Update, context: CallbackContext[Any, Any, Any, Any]) -> None:
        bot = context.bot

        async def send(incoming: Incoming, text: str) -> object:
            return await bot.send_message(
                incoming.chat_id,
                text,
                message_thread_id=incoming.topic_id,
                reply_parameters=ReplyParameters(incoming.message_id, allow_sending_without_reply=True),
            )

        answered = await telegram.handle_update(
            update.to_dict(),
            self.publisher,
            self.memory,
            bot_username=_username(bot),
            answer_commands=self.answer_commands,
            send=send,
        )
        if answered:
            raise ApplicationHandlerStop  # the command is handled: the bot's handlers do not see it


def _username(bot: Bot) -> str | None:
    try:
        return bot.username
    except RuntimeError:  # not initialized: commands addressed to any bot are taken as ours
        return None


def record_bot_messages(bot: Bot, publisher: EventPublisher) -> None:
    """Wrap the bot's request object so that the messages it sends are published (idempotent)."""
    requests = getattr(bot, "_request", None)
    if not (isinstance(requests, tuple) and len(requests) == 2 and isinstance(requests[1], BaseRequest)):
        raise RuntimeError("this python-telegram-bot version keeps its request objects elsewhere; pin 22.x")
    if isinstance(requests[1], RecordingRequest):
        return
    # Index 0 serves getUpdates only; index 1 every other method.
    bot._request = (requests[0], RecordingRequest(requests[1], publisher, bot))


class RecordingRequest(BaseRequest):
    """Delegates to the bot's own request object and publishes the messages in its answers."""

    def __init__(self, inner: BaseRequest, publisher: EventPublisher, bot: Bot | None = None):
        self.inner = inner
        self.publisher = publisher
        self.bot = bot  # whose id a deletion it makes carries

    @property
    def read_timeout(self) -> float | None:
        return self.inner.read_timeout

    async def initialize(self) -> None:
        await self.inner.initialize()

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        code, payload = await self.inner.do_request(
            url,
            method,
            request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        # The URL holds the token: only its last segment, the method name, is looked at.
        endpoint = url.rsplit("/", 1)[-1]
        if method != "POST" or not 200 <= code < 300:
            return code, payload
        deletes = endpoint.lower() in telegram.DELETE_METHODS
        if deletes or (endpoint.lower().startswith(_MESSAGE_METHOD_PREFIXES) and not telegram.is_quiet()):
            try:
                answer = json.loads(payload)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and deletes:
                params = request_data.parameters if request_data is not None else {}
                telegram.record_deleted(self.publisher, endpoint, params, answer.get("result"), self._bot_id())
            elif isinstance(answer, dict):
                telegram.record_sent(self.publisher, endpoint, answer.get("result"))
        return code, payload

    def _bot_id(self) -> int | None:
        try:
            return self.bot.id if self.bot is not None else None
        except RuntimeError:  # not initialized yet
            return None


# --- thin wrappers over producers/telegram.py for PTB objects ---------------------------------
def context_for(memory: MemoryView, update: Update, *, query: str | None = None, **kw: Any) -> list[dict]:
    """`build_context` messages for the bot's LLM call about this update's message."""
    return telegram.context_for(memory, update.to_dict(), query=query, **kw)


def recall_reply(memory: MemoryView, update: Update, question: str | None = None, *, limit: int = 5) -> str:
    """An answer from memory with citations rendered as t.me links where Telegram has them."""
    return telegram.recall_reply(memory, update.to_dict(), question, limit=limit)


async def set_commands(bot: Bot) -> bool:
    """Register the memory commands in the bot's command menu (setMyCommands)."""
    return await bot.set_my_commands(telegram.bot_commands())
