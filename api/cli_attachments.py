"""`chatmem attachments`: what happened to attachments, and retrying the failed ones."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from chatmem.api.common import cli_container, cli_settings, console, print_json

attachments_app = typer.Typer(help="Attachments: status, failure reasons, retries.", no_args_is_help=True)


@attachments_app.command("list")
def attachments_list(
    status: str = typer.Option(None, help="pending | done | failed"),
    thread: str = typer.Option(None, help="only this thread"),
    limit: int = typer.Option(50, min=1),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Attachments, newest first, with their status and the reason of a failure."""
    if status not in (None, "pending", "done", "failed"):
        console.print(f"[red]unknown status {status!r}: pending, done or failed[/red]")
        raise typer.Exit(2)
    rows = cli_container(cli_settings()).attachment_store.listing(status, thread, limit)
    if as_json:
        print_json(json.dumps(rows, default=str, ensure_ascii=False), indent=None)
        return
    table = Table()
    for col in ("thread", "message event", "file", "status", "reason / description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        file = f"{(r['sha256'] or '')[:8]} {r['mime_type'] or ''}".strip()
        table.add_row(
            r["thread_id"], f"{r['event_id']}#{r['position']}", file, r["status"], r["reason"] or r["description"] or ""
        )
    console.print(table)


@attachments_app.command("retry")
def attachments_retry(thread: str = typer.Option(None, help="only this thread")) -> None:
    """Queue the failed attachments again (after a URL is back or a limit was raised)."""
    from chatmem.adapters.celery_queue import enqueue_attachment

    c = cli_container(cli_settings())
    refs = c.attachment_store.reset_failed(thread)
    for event_id, position in refs:
        enqueue_attachment(c.celery, event_id, position)
    console.print(f"queued {len(refs)} attachments again")


@attachments_app.command("reanalyse")
def attachments_reanalyse(
    recordings: bool = typer.Option(
        False, "--recordings", help="also send every recording and video to the speech model again (billed)"
    ),
) -> None:
    """Analyse every stored image, video and document again with the OCR and vision settings in
    use now (after a model change): each file's texts and its messages' surrogates are swapped at
    once, so reads see the old analysis or the new. A file that fails now keeps its old analysis.
    A video keeps the words heard before; recordings, and videos' speech, are sent again only with
    --recordings (after a change of speech model)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    c = cli_container(cli_settings())
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} files"))
    with Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("re-analysing", total=None)
        done = c.reanalyse_attachments(
            lambda n, total: progress.update(task, completed=n, total=total), recordings=recordings
        )
    console.print(f"re-analysed {done['files']:,} files; {done['failed']:,} failed and kept their old analysis")
