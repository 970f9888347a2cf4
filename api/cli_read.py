"""`chatmem` commands of the read path: context, recall, threads, episodes, the HTTP API and
its keys, and the importers. Registered on the main app in api/cli.py."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import typer
from rich.table import Table

from chatmem.api.common import cli_container, cli_settings, console, print_json, start_metrics
from chatmem.serving import ready_to_serve

keys_app = typer.Typer(help="API keys for the HTTP API (each scoped to its users).", no_args_is_help=True)
import_app = typer.Typer(help="Publish conversations from files as events.", no_args_is_help=True)


def _checked_id(value: str, field: str) -> str:
    from chatmem.schemas.events import InvalidEvent, validate_identifier

    try:
        return validate_identifier(value, field)
    except InvalidEvent as error:
        console.print(f"[red]{error.reason}[/red]")
        raise typer.Exit(2) from None


def context(
    thread: str = typer.Argument(..., help="thread id"),
    user: str = typer.Option(..., "--user", help="the user reading"),
    query: str = typer.Option(None, "--query", "-q", help="the user's new message"),
    max_tokens: int = typer.Option(None, "--max-tokens", help="budget (default: settings)"),
    as_json: bool = typer.Option(False, "--json", help="print the bundle as JSON"),
) -> None:
    """The token-budgeted context a bot would send with its next reply."""
    from chatmem.memory.recall import NotReadable

    c = cli_container(cli_settings())
    try:
        bundle = c.build_context(
            _checked_id(thread, "thread_id"), _checked_id(user, "user_id"), query, max_tokens=max_tokens
        )
    except NotReadable:
        console.print(f"[red]no thread {thread!r} for user {user!r}[/red]")
        raise typer.Exit(1) from None
    if as_json:
        print_json(bundle.model_dump_json(indent=2))
        return
    table = Table(title=f"context · {bundle.tokens}/{bundle.max_tokens} tokens ({bundle.counter})")
    for col in ("section", "tokens", "budget", "items", "trimmed", "first item"):
        table.add_column(col)
    for s in bundle.sections:
        first = s.items[0].text[:70] if s.items else ""
        table.add_row(s.name, str(s.tokens), str(s.budget), str(len(s.items)), str(s.trimmed), first)
    console.print(table)


def recall(
    query: str = typer.Argument(..., help="what to look for"),
    user: str = typer.Option(..., "--user", help="the user reading"),
    thread: str = typer.Option(None, "--thread", help="only this thread"),
    scope: str = typer.Option("all", help="all | summaries | messages | facts | artifacts"),
    limit: int = typer.Option(10, min=1, max=100),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Hybrid search with citations."""
    from chatmem.memory.recall import NotReadable
    from chatmem.schemas.read import Scope

    try:
        scope_ = Scope(scope)
    except ValueError:
        console.print(f"[red]scope must be one of {', '.join(s.value for s in Scope)}[/red]")
        raise typer.Exit(2) from None
    c = cli_container(cli_settings())
    try:
        result = c.recall(
            _checked_id(user, "user_id"),
            query,
            scope=scope_,
            limit=limit,
            thread_id=_checked_id(thread, "thread_id") if thread else None,
        )
    except NotReadable:
        console.print(f"[red]no thread {thread!r} for user {user!r}[/red]")
        raise typer.Exit(1) from None
    if as_json:
        print_json(result.model_dump_json(indent=2))
        return
    table = Table(title=f"recall · {query!r} · {scope_.value}")
    for col in ("#", "kind", "score", "where", "snippet"):
        table.add_column(col)
    for n, h in enumerate(result.hits, 1):
        c_ = h.citation
        where = f"{c_.thread_id} {c_.platform_message_id or ''} #{c_.seq if c_.seq is not None else '-'}"
        table.add_row(str(n), h.kind + (" (archived)" if h.archived else ""), f"{h.score:.2f}", where, h.snippet)
    console.print(table)


def threads(user: str = typer.Option(..., "--user", help="the user whose threads to list")) -> None:
    """Threads a user wrote in, newest first."""
    rows = cli_container(cli_settings()).browser.threads_of(_checked_id(user, "user_id"))
    table = Table(title=f"threads of {user}")
    for col in ("thread", "messages", "episodes", "last message", "generation"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["thread_id"],
            str(r["message_count"]),
            str(r["episode_count"]),
            str(r["last_message_at"] or "-"),
            str(r["generation"]),
        )
    console.print(table)


def episodes(
    thread: str = typer.Argument(..., help="thread id"),
    user: str = typer.Option(..., "--user", help="the user reading"),
) -> None:
    """A thread's episodes with how they opened and closed."""
    c = cli_container(cli_settings())
    thread = _checked_id(thread, "thread_id")
    if not c.browser.readable_threads(_checked_id(user, "user_id"), thread):
        console.print(f"[red]no thread {thread!r} for user {user!r}[/red]")
        raise typer.Exit(1)
    table = Table(title=f"episodes of {thread}")
    for col in ("episode", "status", "seq", "messages", "opened by", "closed by", "topic"):
        table.add_column(col)
    for e in c.browser.episodes(thread):
        table.add_row(
            e["episode_id"],
            e["status"],
            f"{e['start_seq']}-{e['end_seq'] if e['end_seq'] is not None else ''}",
            str(e["messages"]),
            e["opened_by"],
            e["closed_by"] or "",
            (e["topic_label"] or "")[:60],
        )
    console.print(table)


def api(
    host: str = typer.Option(None, help="listen address (default: settings)"),
    port: int = typer.Option(None, help="port (default: settings)"),
) -> None:
    """Serve the HTTP read path (OpenAPI docs at /docs)."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from chatmem.api.http import create_app

    settings = cli_settings()
    start_metrics(settings, serve=False)  # its /metrics is on the API's own port
    with closing(cli_container(settings)) as c:  # closed on the way out, as the ingest consumer's
        app = create_app(c)
        ready_to_serve(c)
        uvicorn.run(
            app,
            host=host or settings.api_host,
            port=port or settings.api_port,
            log_level="warning",
            # uvicorn's own logging setup has its own format; without it, its loggers use ours.
            log_config=None if settings.log_format == "json" else LOGGING_CONFIG,
        )


@keys_app.command("create")
def keys_create(
    name: str = typer.Argument(..., help="a name to recognise the key by"),
    user: list[str] = typer.Option(..., "--user", help="a user id the key may read (repeatable; '*' for all)"),
) -> None:
    """Create a key; it is printed once and stored only as a digest."""
    import psycopg

    try:
        key = cli_container(cli_settings()).api_keys.create(name, user)
    except (ValueError, psycopg.errors.UniqueViolation) as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    print(key)


@keys_app.command("list")
def keys_list() -> None:
    """Key names, their users and whether they are revoked."""
    for name, users, revoked in cli_container(cli_settings()).api_keys.list():
        console.print(f"{name}: {', '.join(users)}{' (revoked)' if revoked else ''}")


@keys_app.command("revoke")
def keys_revoke(name: str = typer.Argument(...)) -> None:
    """Revoke a key by name."""
    if not cli_container(cli_settings()).api_keys.revoke(name):
        console.print(f"[red]no active key named {name!r}[/red]")
        raise typer.Exit(1)
    console.print(f"revoked {name}")


# --- import ---------------------------------------------------------------------------------
from typing import TYPE_CHECKING, TypeVar  # noqa: E402  (here, not at the top: this section is edited on its own)

_Found = TypeVar("_Found")

if TYPE_CHECKING:
    from collections.abc import Callable

    from chatmem.producers.importers import ImportReport, Parser
    from chatmem.producers.publisher import Publisher
    from chatmem.schemas.settings import Settings


def _import_publisher(settings: Settings) -> Publisher:
    """Imports publish at bulk priority: the same log, but their threads are processed after
    live ones (docs/architecture.md, "Bulk imports next to live traffic")."""
    from chatmem.producers.publisher import Publisher

    return Publisher.from_settings(settings, bulk=True)


@import_app.command("locomo")
def import_locomo(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="LoCoMo JSON (a list of samples)"),
    sample: list[str] = typer.Option(None, "--sample", help="only these sample ids (repeatable)"),
) -> None:
    """One thread per sample, one message event per turn (see docs/read-path.md)."""
    from chatmem.producers.importers import publish_locomo

    settings = cli_settings()
    with _import_publisher(settings) as pub:
        result = publish_locomo(pub, file, set(sample) if sample else None)
    console.print(f"published {result.accepted} events")


@import_app.command("jsonl")
def import_jsonl(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="one wire event per line")) -> None:
    """Validate and publish wire events; report rejected lines."""
    from chatmem.producers.importers import publish_jsonl

    settings = cli_settings()
    with _import_publisher(settings) as pub:
        result = publish_jsonl(pub, file, settings)
    for line_no, reason in result.rejected:
        console.print(f"[yellow]line {line_no}:[/yellow] {reason}")
    console.print(f"accepted {result.accepted}, rejected {len(result.rejected)}")
    if result.rejected:
        raise typer.Exit(1)


_SERVICE_HELP = "keep service messages (pins, joins, calls) as role=system events instead of skipping them"
_ASSISTANT_HELP = "author id whose messages are the bot's own replies: role assistant (repeatable)"


@import_app.command("telegram")
def import_telegram(
    path: Path = typer.Argument(..., exists=True, help="result.json of a Telegram Desktop JSON export, or its folder"),
    service: bool = typer.Option(False, "--service", help=_SERVICE_HELP),
    assistant: list[str] = typer.Option(None, "--assistant-id", help=_ASSISTANT_HELP + "; e.g. user123"),
) -> None:
    """A chat's export or a whole account's: one thread per chat (see docs/importing.md)."""
    from chatmem.producers.import_telegram import TelegramOptions, find_telegram_export, telegram_items

    settings = cli_settings()
    options = TelegramOptions(
        max_text_chars=settings.max_text_chars,
        keep_service=service,
        assistant_ids=TelegramOptions.assistant(assistant),
    )
    files = _export_files(lambda: [find_telegram_export(path)])
    _run_chat_import(settings, "telegram", files, lambda fh, folder: telegram_items(fh, folder, options))


@import_app.command("discord")
def import_discord(
    path: Path = typer.Argument(..., exists=True, help="a DiscordChatExporter JSON file, or a folder of them"),
    service: bool = typer.Option(False, "--service", help=_SERVICE_HELP),
    assistant: list[str] = typer.Option(None, "--assistant-id", help=_ASSISTANT_HELP),
) -> None:
    """One thread per channel (see docs/importing.md)."""
    from chatmem.producers.import_discord import DiscordOptions, discord_items, find_discord_exports

    settings = cli_settings()
    options = DiscordOptions(
        max_text_chars=settings.max_text_chars, keep_service=service, assistant_ids=frozenset(assistant or [])
    )
    files = _export_files(lambda: find_discord_exports(path))
    _run_chat_import(settings, "discord", files, lambda fh, folder: discord_items(fh, folder, options))


@import_app.command("chatgpt")
def import_chatgpt(
    path: Path = typer.Argument(..., exists=True, help="conversations.json of a ChatGPT data export, or its folder"),
    user: str = typer.Option("me", "--user", help="user_id of the imported conversations"),
) -> None:
    """One thread per conversation, the branch that was on screen (see docs/importing.md)."""
    from chatmem.producers.import_chatgpt import ChatGPTOptions, chatgpt_items, find_chatgpt_export

    settings = cli_settings()
    options = ChatGPTOptions(user_id=_checked_id(user, "user_id"), max_text_chars=settings.max_text_chars)
    files = _export_files(lambda: [find_chatgpt_export(path)])
    _run_chat_import(settings, "chatgpt", files, lambda fh, folder: chatgpt_items(fh, folder, options))


def _import_meta(platform: str, path: Path, service: bool, assistant: list[str] | None) -> None:
    from chatmem.producers.import_meta import MetaOptions, find_meta_exports, meta_items

    settings = cli_settings()
    options = MetaOptions(
        platform=platform,
        max_text_chars=settings.max_text_chars,
        keep_service=service,
        assistant_names=frozenset(assistant or []),
    )
    files = _export_files(lambda: find_meta_exports(path, platform))
    _run_chat_import(settings, platform, files, lambda fh, folder: meta_items(fh, folder, options))


_META_PATH_HELP = "Meta's 'Download your information' export (JSON): its .zip (unpacked beside it) or folder"
_META_ASSISTANT_HELP = "sender name whose messages are the bot's own replies (repeatable)"


@import_app.command("messenger")
def import_messenger(
    path: Path = typer.Argument(..., exists=True, help=_META_PATH_HELP),
    service: bool = typer.Option(False, "--service", help="keep calls, joins and leaves as role=system events"),
    assistant: list[str] = typer.Option(None, "--assistant", help=_META_ASSISTANT_HELP),
) -> None:
    """Facebook Messenger chats: one thread per conversation (see docs/importing.md)."""
    _import_meta("messenger", path, service, assistant)


@import_app.command("instagram")
def import_instagram(
    path: Path = typer.Argument(..., exists=True, help=_META_PATH_HELP),
    service: bool = typer.Option(False, "--service", help="keep calls, joins and leaves as role=system events"),
    assistant: list[str] = typer.Option(None, "--assistant", help=_META_ASSISTANT_HELP),
) -> None:
    """Instagram direct messages: one thread per conversation (see docs/importing.md)."""
    _import_meta("instagram", path, service, assistant)


@import_app.command("slack")
def import_slack(
    path: Path = typer.Argument(
        ..., exists=True, help="a Slack workspace export: its .zip (unpacked beside it) or folder"
    ),
    service: bool = typer.Option(False, "--service", help=_SERVICE_HELP),
    assistant: list[str] = typer.Option(None, "--assistant-id", help=_ASSISTANT_HELP + "; a user id or bot id"),
) -> None:
    """One thread per channel, private channel and DM (see docs/importing.md)."""
    from rich.markup import escape

    from chatmem.producers.import_slack import (
        SlackOptions,
        find_slack_export,
        find_slack_exports,
        read_workspace,
        slack_items,
    )

    settings = cli_settings()
    options = SlackOptions(
        max_text_chars=settings.max_text_chars, keep_service=service, assistant_ids=frozenset(assistant or [])
    )
    root = _export_files(lambda: find_slack_export(path))
    if root != path:
        console.print(f"{escape(path.name)}: the export's folder is {escape(str(root))}")
    workspace = _export_files(lambda: read_workspace(root))
    files = _export_files(lambda: find_slack_exports(root))
    _run_chat_import(settings, "slack", files, lambda fh, folder: slack_items(fh, folder, workspace, options))


@import_app.command("whatsapp")
def import_whatsapp(
    path: Path = typer.Argument(
        ...,
        exists=True,
        help="the chat's .zip, .txt or folder from WhatsApp's Export chat (a zip is unpacked beside it)",
    ),
    timezone: str = typer.Option(
        None, "--timezone", help="the exporting phone's zone, e.g. Europe/Berlin (default: this computer's)"
    ),
    date_order: str = typer.Option(None, "--date-order", help="dmy, mdy or ymd (default: read from the file)"),
    chat: str = typer.Option(None, "--chat", help="the chat's name (default: from the file or folder name)"),
    service: bool = typer.Option(False, "--service", help=_SERVICE_HELP),
    assistant: list[str] = typer.Option(
        None, "--assistant", help="author name whose messages are the bot's own replies (repeatable)"
    ),
) -> None:
    """One thread per chat; times are the phone's local times (see docs/importing.md)."""
    from rich.markup import escape

    from chatmem.producers.import_whatsapp import (
        DateOrder,
        WhatsAppOptions,
        chat_name,
        find_whatsapp_export,
        sniff_layout,
        thread_id_for,
        time_zone,
        whatsapp_items,
    )

    settings = cli_settings()
    (file,) = _export_files(lambda: [find_whatsapp_export(path)])
    if path.suffix.lower() == ".zip":
        console.print(f"{escape(path.name)}: the export's folder is {escape(str(file.parent))}")
    try:
        zone, zone_name = time_zone(timezone)
        if date_order and date_order.lower() not in {o.value for o in DateOrder}:
            raise ValueError(f"--date-order {date_order!r}: dmy, mdy or ymd")
        with open(file, "rb") as fh:
            layout = sniff_layout(fh, order=DateOrder(date_order.lower()) if date_order else None)
    except (ValueError, OSError) as error:  # ImportFormatError too
        console.print(f"[red]{escape(file.name)}: {escape(str(error))}[/red]")
        raise typer.Exit(2) from None
    options = WhatsAppOptions(
        chat=chat or chat_name(file),
        zone=zone,
        date_order=layout.date_order,
        keep_service=service,
        assistant_names=frozenset(assistant or []),
        max_text_chars=settings.max_text_chars,
        layout=layout,
    )
    console.print(
        f"{escape(file.name)}: thread {thread_id_for(options.chat)}, dates {escape(layout.decided_by)},"
        f" times in {escape(zone_name)}"
    )
    _run_chat_import(
        settings, "whatsapp", [file], lambda fh, folder: whatsapp_items(fh, folder, options), json_files=False
    )


def _export_files(find: Callable[[], _Found]) -> _Found:
    """What `find` reads of an export; a message and exit status 2 when it is not the export."""
    from rich.markup import escape

    from chatmem.producers.importers import ImportFormatError

    try:
        return find()
    except ImportFormatError as error:
        console.print(f"[red]{escape(str(error))}[/red]")
        raise typer.Exit(2) from None


def _run_chat_import(
    settings: Settings, name: str, files: list[Path], parse: Parser, *, json_files: bool = True
) -> None:
    """Parse, skip what the event log holds, publish; a progress bar, then the counts. Exit 1 when
    items failed, 2 for a file that is not the export, 130 when interrupted (rerun to resume)."""
    from functools import partial

    import psycopg
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from chatmem.adapters.imported_pg import known_event_ids
    from chatmem.producers.importers import ChatImport, ImportFormatError
    from chatmem.producers.publisher import PublishError

    c = cli_container(settings)
    error: str | None = None
    code = 0
    try:
        with (
            _import_publisher(settings) as pub,
            Progress(
                TextColumn(f"[bold]import {name}[/bold]"),
                BarColumn(),
                DownloadColumn(),
                TextColumn("{task.fields[items]:,} messages · {task.fields[rate]:,.0f}/s"),
                TimeRemainingColumn(),
                console=console,
            ) as progress,
        ):
            task = progress.add_task(name, total=None, items=0, rate=0.0)

            def show(report: ImportReport) -> None:
                rate = report.items / report.seconds if report.seconds else 0.0
                progress.update(
                    task, completed=report.bytes_read, total=report.bytes_total, items=report.items, rate=rate
                )

            run = ChatImport(pub, partial(known_event_ids, c.pool), on_progress=show, json_files=json_files)
            try:
                run.run(files, parse)
            except KeyboardInterrupt:
                error, code = "interrupted: run the same command again to continue", 130
            except ImportFormatError as problem:
                error, code = str(problem), 2
            except PublishError as problem:
                error, code = f"{problem}; run the same command again to continue", 1
            except psycopg.Error as problem:
                error, code = f"database error: {problem}; run the same command again to continue", 1
            except OSError as problem:
                error, code = f"cannot read the export: {problem}", 1
    finally:
        c.close()
    if run.report.items or not error:  # a file refused up front has nothing to count
        _print_import_report(name, run.report)
    if error:
        console.print(f"[red]{escape(error)}[/red]")
    raise typer.Exit(code or (1 if run.report.failed else 0))


def _print_import_report(name: str, report: ImportReport) -> None:
    from rich.markup import escape

    table = Table(title=f"import {name}")
    table.add_column("messages")
    table.add_column("count", justify="right")
    table.add_row("published (new events)", f"{report.published:,}")
    table.add_row("skipped: already imported", f"{report.already_imported:,}")
    for reason, count in sorted(report.skipped.items()):
        table.add_row(escape(f"skipped: {reason}"), f"{count:,}")
    table.add_row("failed", f"{report.failed:,}")
    table.add_row("attachments of the new events", f"{report.attachments:,}")
    for reason, count in sorted(report.attachments_skipped.items()):
        table.add_row(escape(f"attachments not imported: {reason}"), f"{count:,}")
    console.print(table)
    for ref, reason in report.failures:
        console.print(f"[yellow]failed[/yellow] {escape(ref)}: {escape(reason)}")
    if report.failed > len(report.failures):
        console.print(f"… and {report.failed - len(report.failures):,} more failed")
    rate = report.items / report.seconds if report.seconds else 0.0
    console.print(
        f"{report.published:,} new events published ({report.items:,} messages read in {report.seconds:.1f} s,"
        f" {rate:,.0f}/s)"
    )


def dead_letters(
    limit: int = typer.Option(20, min=1, max=10_000, help="most rows of each kind"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Refused stream entries with their reasons, and event notices: an event_id reused with other
    content (both versions kept), producer clocks out of range (original time kept), and events
    whose batch a worker could not apply (where it was raised; the thread waits there)."""
    import json

    c = cli_container(cli_settings())
    letters, notices = c.notices.dead_letters(limit), c.notices.notices(limit)
    if as_json:
        print(
            json.dumps(
                {"dead_letters": [r._asdict() for r in letters], "notices": [r._asdict() for r in notices]},
                default=str,
                indent=2,
            )
        )
        return
    table = Table(title=f"dead letters ({len(letters)} newest)")
    for col in ("entry", "reason", "seen", "raw"):
        table.add_column(col, overflow="fold")
    for r in letters:
        table.add_row(
            f"{r.source}:{r.entry_id}", r.reason, f"{r.delivery_count}× {r.last_seen:%Y-%m-%d %H:%M}", r.raw_preview
        )
    console.print(table)
    table = Table(title=f"event notices ({len(notices)} newest)")
    for col in ("kind", "event", "detail", "not logged"):
        table.add_column(col, overflow="fold")
    for n in notices:
        table.add_row(n.kind, n.event_id, n.detail, json.dumps(n.payload)[:200] if n.payload else "")
    console.print(table)


def export(
    user: str = typer.Option(..., "--user", help="the user whose data to export"),
    out: Path = typer.Option(..., "--out", file_okay=False, help="a folder for export.json and the files"),
) -> None:
    """Everything held about a user, as one JSON document with their files beside it: the events
    they published, their messages, the episodes and summaries of their threads, their facts
    with history, their attachments and what was read from them (right of access, portability)."""
    import json
    import mimetypes

    user_id = _checked_id(user, "user_id")
    c = cli_container(cli_settings())
    data = c.export.user(user_id)
    files = out / "files"
    files.mkdir(parents=True, exist_ok=True)
    copied = 0
    for item in data["attachments"]:
        sha = item["sha256"]
        if sha is None or not c.blobs.path(sha).exists():
            item["file"] = None
            continue
        name = sha + (mimetypes.guess_extension(item["mime_type"] or "") or "")
        (files / name).write_bytes(c.blobs.get(sha))
        item["file"] = f"files/{name}"
        copied += 1
    (out / "export.json").write_text(json.dumps(data, default=str, ensure_ascii=False, indent=2), encoding="utf-8")
    counts = ", ".join(f"{len(data[k])} {k}" for k in ("events", "messages", "episodes", "summaries", "facts"))
    console.print(f"exported {user_id} to {out / 'export.json'}: {counts}, {copied} files")


def erase(
    user: str | None = typer.Option(None, "--user", help="erase this user, in every thread"),
    thread: str | None = typer.Option(None, "--thread", help="erase this thread, every user's events in it"),
    yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
    as_json: bool = typer.Option(False, "--json", help="print the counts as JSON"),
) -> None:
    """Erase a user or a thread for good (right to erasure): their data keys are destroyed, so
    the event log keeps only tombstones that replay cannot read; every projection, cache, file,
    mem0 memory, dead letter, pending stream entry and spooled event derived from them is
    removed, and shared threads are rebuilt without them. Prints what was removed per store."""
    import json

    if (user is None) == (thread is None):
        raise typer.BadParameter("give exactly one of --user or --thread")
    user_id = _checked_id(user, "user_id") if user is not None else None
    thread_id = _checked_id(thread, "thread_id") if thread is not None else None
    subject = f"user {user_id}" if user_id else f"thread {thread_id}"
    if not yes and not typer.confirm(f"erase {subject} for good? This cannot be undone"):
        raise typer.Exit(1)
    c = cli_container(cli_settings())
    removed = c.erase(user_id=user_id, thread_id=thread_id, requested_by="cli")
    if as_json:
        print(json.dumps({"erased": subject, "removed": removed}, indent=2))
        return
    table = Table(title=f"erased {subject}")
    table.add_column("store")
    table.add_column("removed", justify="right")
    for store, count in removed.items():
        table.add_row(store, f"{count:,}")
    console.print(table)


def register(app: typer.Typer) -> None:
    for fn in (context, recall, threads, episodes, api):
        app.command()(fn)
    app.command("dead-letters")(dead_letters)
    app.command("export")(export)
    app.command("erase")(erase)
    app.add_typer(keys_app, name="keys")
    app.add_typer(import_app, name="import")
