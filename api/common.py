"""What every `chatmem` command shares: settings (with a clear error), the console, a container."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from chatmem.adapters.logs import configure_logging, is_utf8
from chatmem.schemas.settings import Settings, load_settings

if TYPE_CHECKING:
    from chatmem.bootstrap import Container

console = Console()


def printable_output() -> None:
    """On a machine set to a legacy locale (ISO-8859-1, say), stdout and stderr show what they can
    and escape the rest (a message's emoji as \\U0001f600) instead of failing on it."""
    for stream in (sys.stdout, sys.stderr):
        if not is_utf8(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def print_json(text: str, indent: int | None = 2) -> None:
    """A JSON document on stdout; where stdout is not UTF-8, with JSON's own escapes for what its
    encoding cannot hold, so any JSON reader still reads it."""
    if not is_utf8(sys.stdout):
        text = json.dumps(json.loads(text), indent=indent, ensure_ascii=True)
    print(text)


def cli_settings() -> Settings:
    try:
        settings = load_settings()
    except Exception as error:  # a typo in the environment must stop us with its name
        console.print(f"[red]settings error:[/red] {error}")
        raise typer.Exit(2) from None
    configure_logging(settings.log_level, settings.log_format)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    return settings


def start_metrics(settings: Settings, *, serve: bool = True) -> None:
    """Record this process's metrics under metrics_dir, where the API's /metrics adds them up;
    with metrics_port set (compose), also serve them on that port."""
    from chatmem.adapters import metrics

    metrics.use_multiprocess_dir(settings.resolved_metrics_dir)
    if serve and settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_host)


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
