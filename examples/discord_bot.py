"""A Discord bot with memory, in one file.

    DISCORD_BOT_TOKEN=... python examples/discord_bot.py

Enable the Message Content intent for the bot (Developer Portal → Bot). Optional: an
OpenAI-compatible endpoint (OPENAI_BASE_URL and/or OPENAI_API_KEY, OPENAI_MODEL) for chat
answers. Without one the bot still answers /whatdoyouknow, /summary and questions addressed
to it ("@bot where did I say we'd meet?") from memory, with links to the messages.
Memory is built by the workers: run `chatmem up` next to it."""

from __future__ import annotations

import os
import re

import discord
from discord.ext import commands

from chatmem.bootstrap import open_memory
from chatmem.producers.chat import parse_command
from chatmem.producers.discord_bot import MemoryCog, add_memory, clip
from chatmem.producers.publisher import Publisher

MENTION = re.compile(r"<@!?\d+>")


class MemoryBot(commands.Bot):
    def __init__(self) -> None:
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(command_prefix=commands.when_mentioned, intents=intents)
        self.memory = open_memory()
        self.publisher = Publisher.from_settings(self.memory.settings)
        self.llm = None
        if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
            from openai import AsyncOpenAI

            self.llm = AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"))
        self.cog: MemoryCog | None = None

    async def setup_hook(self) -> None:
        self.cog = await add_memory(self, self.publisher, self.memory)  # the two lines that add memory
        await self.tree.sync()  # global commands can take a while to appear in every client

    async def on_message(self, message: discord.Message) -> None:
        # The cog has already published the message; here the bot decides whether to answer.
        if self.cog is None or message.author.bot or parse_command(message.content):
            return
        addressed = message.guild is None or (self.user is not None and self.user in message.mentions)
        query = MENTION.sub("", message.content).strip()
        if not addressed or not query:
            return
        async with message.channel.typing():
            if self.llm is not None:
                messages = await self.cog.context_for(message, query=query)
                out = await self.llm.chat.completions.create(
                    model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                    messages=messages,  # type: ignore[arg-type]
                )
                answer = out.choices[0].message.content or "…"
            elif query.endswith("?"):
                answer = await self.cog.recall_reply(message, query)
            else:
                answer = "I remember this chat. Ask me a question, or try /whatdoyouknow and /summary."
        await message.reply(clip(answer), mention_author=False)  # published too, as the assistant


def main() -> None:
    bot = MemoryBot()
    try:
        bot.run(os.environ["DISCORD_BOT_TOKEN"])
    finally:
        bot.publisher.close()  # sends what is still buffered
        bot.memory.close()


if __name__ == "__main__":
    main()
