"""Memory for an aiogram 3 bot:

    dp, bot = Dispatcher(), Bot(TOKEN)
    telegram_aiogram.add_memory(dp, bot, publisher, memory=open_memory())

`add_memory` puts an outer middleware on the dispatcher's update observer (it sees every update
before any router; the bot's handlers still run) that publishes each message, edit and memory
command fire-and-forget, and a request middleware on the bot's session, which sees every Bot API
call with its result, so each message the bot sends is published as an `assistant` message. The
mapping itself is producers/telegram.py, shared with python-telegram-bot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiogram import BaseMiddleware, Bot, Dispatcher
from aiogram.client.session.middlewares.base import BaseRequestMiddleware, NextRequestMiddlewareType
from aiogram.methods import TelegramMethod
from aiogram.methods.base import Response, TelegramType
from aiogram.types import BotCommand, ReplyParameters, TelegramObject, Update
from pydantic import BaseModel

from chatmem.adapters.fetch import install_token_filter
from chatmem.producers import telegram
from chatmem.producers.chat import MemoryView
from chatmem.producers.telegram import EventPublisher, Incoming

# Bot API methods whose answer can be a Message; the others are not mapped.
_MESSAGE_METHOD_PREFIXES = ("send", "edit", "forward", "stop")
# aiogram asks Telegram only for the update types that have handlers (allowed_updates); memory
# needs these whatever handlers the bot has.
_NEEDED_UPDATES = (
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    telegram.BUSINESS_MESSAGE,
    telegram.BUSINESS_EDIT,
    telegram.BUSINESS_DELETED,
)


def add_memory(
    dispatcher: Dispatcher,
    bot: Bot,
    publisher: EventPublisher,
    memory: MemoryView | None = None,
    *,
    answer_commands: bool = True,
    record_replies: bool = True,
) -> None:
    """Publish what the bot receives and sends. With `answer_commands` the memory commands are
    answered here and not passed on to the bot's handlers; `memory` (e.g. `open_memory()`)
    lets /whatdoyouknow and /summary read memory. Call before `dispatcher.start_polling`."""
    install_token_filter()  # aiohttp logs no URLs, but httpx (if the bot uses it) logs every one
    dispatcher.update.outer_middleware(MemoryMiddleware(publisher, memory, answer_commands))
    for name in _NEEDED_UPDATES:
        # A handler whose filter never passes: it only makes the update type "used", so
        # start_polling requests it; the bot's own handlers are unaffected.
        dispatcher.observers[name].register(_never_called, _never)
    if record_replies:
        bot.session.middleware(SentRecorder(publisher))


def _never(*_: object, **__: object) -> bool:
    return False


async def _never_called(*_: object, **__: object) -> None:
    raise AssertionError("filtered out")


def _dump(value: Any) -> Any:
    """aiogram objects as Bot API JSON (`from`, Unix dates)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


class MemoryMiddleware(BaseMiddleware):
    def __init__(self, publisher: EventPublisher, memory: MemoryView | None, answer_commands: bool):
        self.publisher = publisher
        self.memory = memory
        self.answer_commands = answer_commands

    async def __call__(
        self,
        handler: Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]],
        event: TelegramObject,
        data: dict[str, Any],
    ) -> Any:
        bot: Bot | None = data.get("bot")
        if isinstance(event, Update) and bot is not None:
            me = await bot.me()  # cached after the first call (start_polling makes it)

            async def send(incoming: Incoming, text: str) -> object:
                return await bot.send_message(
                    chat_id=incoming.chat_id,
                    text=text,
                    message_thread_id=incoming.topic_id,
                    reply_parameters=ReplyParameters(message_id=incoming.message_id, allow_sending_without_reply=True),
                )

            answered = await telegram.handle_update(
                _dump(event),
                self.publisher,
                self.memory,
                bot_username=me.username,
                answer_commands=self.answer_commands,
                send=send,
            )
            if answered:
                return None  # the command is handled: the routers do not see it
        return await handler(event, data)


class SentRecorder(BaseRequestMiddleware):
    """A session middleware: publishes the messages in the answers to the bot's calls, and the
    deletions it makes."""

    def __init__(self, publisher: EventPublisher):
        self.publisher = publisher

    async def __call__(
        self,
        make_request: NextRequestMiddlewareType[TelegramType],
        bot: Bot,
        method: TelegramMethod[TelegramType],
    ) -> Response[TelegramType]:
        response = await make_request(bot, method)
        name = method.__api_method__
        if name.lower() in telegram.DELETE_METHODS:
            result = response.result if isinstance(response, Response) else response
            params = method.model_dump(mode="json", exclude_none=True)
            telegram.record_deleted(self.publisher, name, params, result, bot.id)
        elif name.lower().startswith(_MESSAGE_METHOD_PREFIXES) and not telegram.is_quiet():
            # The chain is typed as returning a Response, but the session hands back the result
            # itself (aiogram 3.31); accept both.
            result = response.result if isinstance(response, Response) else response
            telegram.record_sent(self.publisher, name, _dump(result))
        return response


# --- thin wrappers over producers/telegram.py for aiogram objects -----------------------------
def context_for(memory: MemoryView, message: TelegramObject, *, query: str | None = None, **kw: Any) -> list[dict]:
    """`build_context` messages for the bot's LLM call about this message (or update)."""
    return telegram.context_for(memory, _dump(message), query=query, **kw)


def recall_reply(memory: MemoryView, message: TelegramObject, question: str | None = None, *, limit: int = 5) -> str:
    """An answer from memory with citations rendered as t.me links where Telegram has them."""
    return telegram.recall_reply(memory, _dump(message), question, limit=limit)


async def set_commands(bot: Bot) -> bool:
    """Register the memory commands in the bot's command menu (setMyCommands)."""
    return await bot.set_my_commands([BotCommand(command=c, description=d) for c, d in telegram.bot_commands()])
