"""A Telegram bot with memory (python-telegram-bot), in one file.

    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/telegram_bot.py

Everything the bot receives and sends is published to chatmem; the workers (`chatmem up`) build
memory from it. The memory commands (/remember, /forget, /summary, /newtopic, /memory_off,
/memory_on, /whatdoyouknow) are answered by chatmem's adapter. Other text messages:
- with an LLM (CHATMEM_LLM_API_KEY or OPENAI_API_KEY; optional CHATMEM_LLM_BASE_URL or
  OPENAI_BASE_URL, and CHATMEM_LLM_MODEL): the model answers, given chatmem's context;
- without one: a question (ending in "?") is answered from memory, with links to the original
  messages where Telegram has them; anything else is just remembered.
Connected to a Telegram Business account, it answers the account's customers the same way, for
the business (each business's memory apart; docs/chat-adapters.md), and leaves the owner's own
messages unanswered. For photos and documents to be read, the attachments worker needs the same
token in CHATMEM_TELEGRAM_BOT_TOKEN. `--api-url` points the bot at another Bot API server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from telegram import Bot, LinkPreviewOptions, Message, Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from chatmem.bootstrap import open_memory
from chatmem.producers import telegram_ptb
from chatmem.producers.publisher import Publisher
from chatmem.schemas.settings import Settings

log = logging.getLogger("telegram_bot")
Complete = Callable[[list[dict[str, Any]]], str]


def openai_chat(settings: Settings) -> Complete | None:
    """A chat-completion function for an OpenAI-compatible endpoint, or None without a key."""
    key = settings.llm_api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        return None
    from openai import OpenAI

    client = OpenAI(api_key=key, base_url=settings.llm_base_url or os.environ.get("OPENAI_BASE_URL"))

    def complete(messages: list[dict[str, Any]]) -> str:
        answer = client.chat.completions.create(model=settings.llm_model, messages=messages)  # type: ignore[arg-type]
        return answer.choices[0].message.content or ""

    return complete


def main() -> None:
    parser = argparse.ArgumentParser(description="A Telegram bot with chatmem memory.")
    parser.add_argument("--api-url", default="https://api.telegram.org", help="Bot API base URL")
    args = parser.parse_args()
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    if not token:
        parser.error("set TELEGRAM_BOT_TOKEN")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    memory = open_memory()  # CHATMEM_* settings; the embedded services when no URL is set
    publisher = Publisher.from_settings(memory.settings)
    complete = openai_chat(memory.settings)

    owners: dict[str, tuple[int, bool]] = {}  # business connection -> (its owner, may the bot reply)

    async def not_ours_to_answer(message: Message, bot: Bot) -> bool:
        """In a business chat: the owner's own messages, or a connection that may not reply."""
        connection = message.business_connection_id
        if connection is None:
            return False
        if connection not in owners:
            found = await bot.get_business_connection(connection)
            owners[connection] = (found.user.id, found.rights is None or bool(found.rights.can_reply))
        owner, may_reply = owners[connection]
        return not may_reply or (message.from_user is not None and message.from_user.id == owner)

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if message is None or not message.text or await not_ours_to_answer(message, context.bot):
            return
        if complete is not None:
            try:
                # The read path and the LLM client block: off the event loop.
                messages = await asyncio.to_thread(telegram_ptb.context_for, memory, update)
                reply = await asyncio.to_thread(complete, messages)
            except Exception:  # the model being down must not silence the bot: recall still works
                log.exception("the LLM call failed; answering from memory")
            else:
                await message.reply_text(reply)
                return
        if message.text.rstrip().endswith("?"):
            reply = await asyncio.to_thread(telegram_ptb.recall_reply, memory, update)
            await message.reply_text(reply, link_preview_options=LinkPreviewOptions(is_disabled=True))

    async def post_init(application: Application[Any, Any, Any, Any, Any, Any]) -> None:
        await telegram_ptb.set_commands(application.bot)

    api = args.api_url.rstrip("/")
    app = (
        Application.builder()
        .token(token)
        .base_url(f"{api}/bot")
        .base_file_url(f"{api}/file/bot")
        .post_init(post_init)
        .build()
    )
    telegram_ptb.add_memory(app, publisher, memory=memory)
    new = filters.UpdateType.MESSAGE | filters.UpdateType.BUSINESS_MESSAGE
    app.add_handler(MessageHandler(new & filters.TEXT & ~filters.COMMAND, answer))
    try:
        app.run_polling()
    finally:
        publisher.close()
        memory.close()


if __name__ == "__main__":
    main()
