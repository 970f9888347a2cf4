"""The `chatmem` command."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from chatmem.api import cli_read
from chatmem.api.cli_attachments import attachments_app
from chatmem.api.common import cli_container, cli_settings, console, print_json, printable_output, start_metrics
from chatmem.serving import ready_to_serve

if TYPE_CHECKING:
    from chatmem.adapters.llm import CachedLLM
    from chatmem.bootstrap import Container

app = typer.Typer(help="chatmem: conversation memory for chat bots.", no_args_is_help=True, add_completion=False)
services_app = typer.Typer(help="Embedded Postgres and Redis (used when no URL is configured).", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (printed figures, never assertions).", no_args_is_help=True)
app.add_typer(services_app, name="services")
app.add_typer(bench_app, name="bench")
app.add_typer(attachments_app, name="attachments")


# --- services ------------------------------------------------------------------------------
@services_app.command("up")
def services_up() -> None:
    """Start the embedded Postgres and Redis (the configured external ones are only checked)."""
    from chatmem.adapters import services

    urls = services.resolve(cli_settings(), start=True)
    console.print(f"postgres: {services.shown(urls.database_url)}\nredis:    {services.shown(urls.redis_url)}")


@services_app.command("down")
def services_down() -> None:
    """Stop the embedded Postgres and Redis."""
    from chatmem.adapters import services

    pg, rd = services.embedded(cli_settings())
    for name, svc in (("postgres", pg), ("redis", rd)):
        if svc is not None:
            console.print(f"{name}: {'stopped' if svc.stop() else 'was not running'}")


@services_app.command("status")
def services_status() -> None:
    """Show where Postgres and Redis are and whether they answer."""
    from chatmem.adapters import services

    for st in services.status(cli_settings()):
        mark = "[green]up[/green]" if st.running else "[red]down[/red]"
        console.print(f"{st.name:9} {mark}  {st.url or '-'}  ({st.detail})")


@services_app.command("dump")
def services_dump(file: Path = typer.Argument(..., dir_okay=False, help="output file (pg_dump custom format)")) -> None:
    """Dump the whole database to FILE: a backup, or a move to another server or Postgres version."""
    from chatmem.adapters import services

    urls = services.resolve(cli_settings(), start=True)
    services.dump(urls.database_url, file)
    console.print(f"dumped to {file} ({file.stat().st_size:,} bytes)")


@services_app.command("restore")
def services_restore(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a `services dump` file"),
) -> None:
    """Load a dump into an empty database (a new data folder or an empty external one), then migrate."""
    from chatmem.adapters import migrate as m
    from chatmem.adapters import services

    settings = cli_settings()
    urls = services.resolve(settings, start=True)
    services.restore(urls.database_url, file)
    applied = m.migrate(urls.database_url, settings.vector_dim)
    console.print(f"restored {file}" + (f"; applied {', '.join(applied)}" if applied else ""))


@app.command()
def migrate() -> None:
    """Apply the SQL migrations that are not applied yet (idempotent)."""
    from chatmem.adapters import migrate as m
    from chatmem.adapters import services

    urls = services.resolve(cli_settings(), start=True)
    applied = m.migrate(urls.database_url, cli_settings().vector_dim)
    console.print(f"applied: {', '.join(applied)}" if applied else "database is up to date")


# --- write path ----------------------------------------------------------------------------
@app.command()
def publish(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON Lines, one event a line")) -> None:
    """Publish events from a JSONL file (the same as `chatmem import jsonl`)."""
    from chatmem.api.cli_read import import_jsonl

    import_jsonl(file)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@app.command()
def ingest(consumer: str = typer.Option(None, help="consumer name (default: ingest@host:pid)")) -> None:
    """Run one ingest consumer: events stream -> Postgres event log (+ dead letters, doorbells)."""
    from chatmem.workers.ingest import IngestRunner

    settings = cli_settings()
    start_metrics(settings)
    # Closed on the way out: a pool left to the interpreter's exit joins its threads from `__del__`,
    # which can print a traceback into the JSON log.
    with closing(cli_container(settings)) as c:
        IngestRunner(c, consumer).run(_stop_on_signals())


@app.command()
def worker(
    queues: str = typer.Option("all", help="comma-separated queues, or 'all' (see `chatmem queues`)"),
    concurrency: int | None = typer.Option(
        None, min=1, help="worker processes (default: 2, or 1 where the machine or its container has under 3 GiB)"
    ),
) -> None:
    """Run a Celery worker for the given queues."""
    from chatmem.adapters.celery_queue import bound_pool_exit_wait
    from chatmem.adapters.cgroups import machine_memory
    from chatmem.schemas.queues import Queue, default_concurrency, parse_queues, prefetch_for

    settings = cli_settings()
    try:
        qs = parse_queues(queues)
    except ValueError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    if concurrency is None:
        memory = machine_memory()
        concurrency = default_concurrency(memory.total)
        if concurrency == 1:
            logging.getLogger("chatmem.worker").info(
                "one worker process: %.1f GiB of memory %s (two from 3 GiB; --concurrency sets it)",
                memory.total / (1 << 30),
                "in this container" if memory.limited else "on this machine",
            )
    # Pool processes are forked from this one: they write their own files in the same folder.
    start_metrics(settings)
    c = cli_container(settings)
    c.celery.conf.chatmem_preload_model = bool(
        {Queue.SEGMENT, Queue.SUMMARIZE, Queue.FACTS, Queue.ATTACHMENTS} & set(qs)
    )
    c.celery.conf.chatmem_preload_mem0 = Queue.FACTS in qs
    c.celery.conf.chatmem_preload_segmenter = Queue.SEGMENT in qs
    c.celery.conf.chatmem_preload_ocr = Queue.ATTACHMENTS in qs
    if settings.log_format == "json":
        _celery_says_json()
    bound_pool_exit_wait()  # or a warm stop can wait 30 s on a pool process
    if qs == [Queue.ATTACHMENTS] and settings.attachment_worker_nice:
        # Below the message path in CPU priority: on a shared machine, OCR takes what is left.
        os.nice(settings.attachment_worker_nice)
    # argv for Celery's own worker command; the app (and its settings) are ours.
    c.celery.worker_main(
        [
            # The start-up banner is not a log line: with JSON logs, every line must be JSON.
            *(["--quiet"] if settings.log_format == "json" else []),
            "worker",
            "-Q",
            ",".join(q.value for q in qs),
            "-c",
            str(concurrency),
            "--prefetch-multiplier",
            str(prefetch_for(qs)),
            "-n",
            f"chatmem-{'-'.join(q.value for q in qs) if len(qs) < 5 else 'all'}@%h",
            "--loglevel",
            settings.log_level.upper(),
            "-E",
        ]
    )


def _celery_says_json() -> None:
    """Celery's worker writes its shutdown notices straight to stdout from signal handlers
    (`safe_say`, no logging there: its locks are not safe in a handler); keep them JSON too."""
    import celery.apps.worker
    from celery.apps.worker import safe_say

    from chatmem.adapters.logs import raw_json_line

    def say(msg: str, f: Any = sys.__stderr__) -> None:
        if f is None or not hasattr(f, "fileno"):
            return safe_say(msg, f)
        os.write(f.fileno(), raw_json_line(msg, "celery.worker"))

    celery.apps.worker.safe_say = say


@app.command()
def sweeper(interval: float = typer.Option(10.0, help="seconds between sweeps")) -> None:
    """Re-ring lagging threads; re-queue lost final summaries, attachments and fact jobs (memory/sweeper.py)."""
    from chatmem.adapters.celery_queue import enqueue_retention
    from chatmem.adapters.errors import TRANSIENT_ERRORS
    from chatmem.adapters.metrics import record_sweep

    settings = cli_settings()
    start_metrics(settings)
    with closing(cli_container(settings)) as c:
        stop = _stop_on_signals()
        log = logging.getLogger("chatmem.sweeper")
        next_retention = time.monotonic()
        while not stop.is_set():
            try:
                if c.settings.retention_set and time.monotonic() >= next_retention:
                    enqueue_retention(c.celery)  # the maintenance queue runs it; one at a time is enough
                    next_retention = time.monotonic() + c.settings.retention_every_s
                result = c.sweeper.sweep()
            except TRANSIENT_ERRORS as error:
                # Postgres or Redis away for a while: the next sweep catches up. Exiting would turn
                # an outage into a crash loop that `chatmem up` gives up on.
                log.warning("sweep failed, trying again in %.0f s: %s", interval, error)
                stop.wait(interval)
                continue
            record_sweep(result.rung, result.finals, result.attachments, result.facts)
            if result.rung or result.finals or result.attachments or result.facts:
                log.info(
                    "re-rang %d lagging threads, re-queued %d final summaries, %d attachments and %d fact jobs",
                    result.rung,
                    result.finals,
                    result.attachments,
                    result.facts,
                )
            stop.wait(interval)


@app.command()
def queues(csv: bool = typer.Option(False, help="one line, comma-separated")) -> None:
    """List the queue catalogue."""
    from chatmem.schemas.queues import Queue

    names = [q.value for q in Queue]
    print(",".join(names) if csv else "\n".join(names))


@app.command()
def up() -> None:
    """Services, migrations, ingest consumer, a worker for all queues, the sweeper and the HTTP
    API, in the foreground. Ctrl-C stops everything it started."""
    from chatmem.adapters import migrate as m
    from chatmem.adapters import services
    from chatmem.adapters.metrics import use_multiprocess_dir
    from chatmem.workers.supervisor import UP_PROCESSES, RestartPolicy, Supervisor

    settings = cli_settings()
    # Every process of this stack writes its metrics under one folder, which the API adds up:
    # start from zero, and no process needs a port of its own (they would all want the same).
    use_multiprocess_dir(settings.resolved_metrics_dir, clear=True)
    with services.running(settings) as urls:
        m.migrate(urls.database_url, settings.vector_dim)
        banner = (
            f"chatmem up: postgres {services.shown(urls.database_url)} · redis {services.shown(urls.redis_url)} · "
            f"API http://{settings.api_host}:{settings.api_port}/docs · Ctrl-C stops"
        )
        if settings.log_format == "json":  # every line JSON, this one too
            logging.getLogger("chatmem.up").info("%s", banner)
        else:
            console.print(banner)
        policy = RestartPolicy(settings.supervisor_max_restarts, settings.supervisor_restart_window_s)
        supervisor = Supervisor(
            UP_PROCESSES, {"CHATMEM_METRICS_PORT": "0"}, policy=policy, state_file=settings.supervisor_state_file
        )
        supervisor.start()
        code = supervisor.wait()
    raise typer.Exit(code)


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Counts, queue depths, stream state and the largest per-thread lag."""
    from chatmem.status import report

    rep = report(cli_container(cli_settings(), start=False, require_migrated=False))
    if as_json:
        print_json(rep.model_dump_json(indent=2))
        return
    table = Table(title="chatmem status", show_header=False)
    for st in rep.services:
        table.add_row(st.name, "up" if st.running else "down", st.url or "")
    pg = rep.postgres
    compiled = f" (compiled here for this CPU: {pg.vector_library})" if pg.vector_library else ""
    versions = f"Postgres {pg.server_version or '?'}, pgvector {pg.vector_version or '?'}{compiled}"
    table.add_row("versions", versions, f"CPU {pg.cpu}")
    table.add_row(
        "self-check",
        "ok" if pg.self_check == "ok" else "[red]failed[/red]",
        pg.self_check if pg.self_check != "ok" else "",
    )
    for m in rep.models:
        table.add_row(
            "model",
            m.model,
            f"ok (largest difference {m.deviation:.1g})" if m.problem is None else f"[red]{m.problem}[/red]",
        )
    if pg.shared_buffers is not None and pg.vector_graph is not None:
        from chatmem.adapters.pgmemory import MIB

        held = pg.vector_graph <= pg.shared_buffers
        table.add_row(
            "memory",
            f"shared_buffers {pg.shared_buffers // MIB} MB",
            f"messages' graph {pg.vector_graph // MIB} MB"
            + ("" if held else ": [yellow]larger than the buffers, so inserts reread it (docs/platforms.md)[/yellow]"),
        )
    if not rep.migrated:
        table.add_row("schema", "[yellow]not migrated[/yellow]", "run `chatmem migrate`")
    for name, n in rep.counts.items():
        table.add_row("count", name, str(n))
    for name, n in rep.queues.items():
        table.add_row("queue", name, str(n))
    table.add_row(
        "stream", f"length {rep.stream.length}", f"pending {rep.stream.pending}, spooled {rep.stream.spooled}"
    )
    if rep.stream.spool_refused:
        table.add_row(
            "spool",
            "[red]full: events refused[/red]",
            f"{rep.stream.spool_refused} refused, not stored (CHATMEM_SPOOL_MAX_BYTES)",
        )
    table.add_row("lag", str(rep.lag.max_events), rep.lag.thread_id or "")
    colours = {"up": "green", "restarting": "yellow", "failed": "red"}
    for proc in rep.processes:
        state = f"[{colours.get(proc.state, 'white')}]{proc.state}[/]"
        table.add_row(
            "process", proc.command, f"{state}, {proc.restarts} restarts" + (f", pid {proc.pid}" if proc.pid else "")
        )
    console.print(table)


@app.command()
def mcp(
    transport: str = typer.Option("stdio", help="stdio (a client starts this command) or http (streamable HTTP)"),
    host: str = typer.Option(None, help="http: listen address (default: settings)"),
    port: int = typer.Option(None, help="http: port (default: settings); the endpoint is /mcp"),
    user: str = typer.Option(None, "--user", help="stdio: the user whose memory this serves (default: settings)"),
) -> None:
    """Serve memory to MCP clients (Claude Desktop, Cursor, VS Code, ...): see docs/mcp.md."""
    from rich.console import Console

    err = Console(stderr=True)  # on stdio, stdout carries the protocol and nothing else
    settings = cli_settings()
    if transport not in ("stdio", "http"):
        err.print("[red]--transport is stdio or http[/red]")
        raise typer.Exit(2)
    try:
        from chatmem.api import mcp_server
    except ImportError:
        err.print("[red]the MCP server needs the mcp package: pip install 'chatmem[mcp]'[/red]")
        raise typer.Exit(2) from None
    if transport == "http":
        if user:
            err.print("[red]--user is for stdio; over HTTP the API key decides the user[/red]")
            raise typer.Exit(2)
        with closing(cli_container(settings)) as c:
            host, port = host or settings.mcp_host, port or settings.mcp_port
            app = mcp_server.http_app(c, host)
            ready_to_serve(c)
            err.print(f"chatmem MCP server: http://{host}:{port}{mcp_server.MCP_PATH} (send an API key in X-API-Key)")
            mcp_server.run_http(app, host, port)
        return
    served = user or settings.mcp_user
    if not served:
        err.print("[red]stdio serves one user: pass --user U or set CHATMEM_MCP_USER[/red]")
        raise typer.Exit(2)
    from chatmem.schemas.events import InvalidEvent, validate_identifier

    try:
        validate_identifier(served, "user_id")
    except InvalidEvent as error:
        err.print(f"[red]{error.reason}[/red]")
        raise typer.Exit(2) from None
    with closing(cli_container(settings)) as c:
        mcp_server.run_stdio(c, served)


@app.command()
def demo(timeout: float = typer.Option(120.0, help="seconds to wait for processing")) -> None:
    """Bring the stack up, publish a sample conversation, wait until processed, show memory, stop."""
    from chatmem.api.demo import run_demo

    raise typer.Exit(run_demo(cli_settings(), console, timeout))


@app.command()
def replay(
    thread: list[str] = typer.Option(None, "--thread", help="thread id (repeatable)"),
    all_threads: bool = typer.Option(False, "--all", help="every thread"),
    refresh_llm: bool = typer.Option(False, "--refresh-llm", help="ask the LLM again instead of the cache"),
    check: bool = typer.Option(
        False, "--check", help="rebuild into a scratch generation, print the differences, change nothing"
    ),
    jobs: int = typer.Option(1, "--jobs", min=1, help="processes replaying threads side by side"),
    threads_file: Path | None = typer.Option(None, hidden=True, help="thread ids, one per line (for --jobs)"),
) -> None:
    """Rebuild threads' memory from the event log into a new generation and switch to it. With
    --check: compare a rebuild with what is there and exit 1 on any difference. With --jobs N:
    N processes share the threads (a thread is one process's, so its order holds)."""
    from chatmem.schemas.events import InvalidEvent, validate_identifier

    if threads_file is not None:
        thread = [t for t in threads_file.read_text(encoding="utf-8").split() if t]
    elif bool(thread) == all_threads:
        console.print("[red]give --thread T (one or more) or --all[/red]")
        raise typer.Exit(2)
    settings = cli_settings()
    start_metrics(settings, serve=False)  # LLM calls of a refresh count in the cost panel
    c = cli_container(settings)
    try:
        ids = [validate_identifier(t) for t in thread] if thread else c.thread_log.all_threads()
    except InvalidEvent as error:
        console.print(f"[red]{error.reason}[/red]")
        raise typer.Exit(2) from None
    llm = c.llm("maintenance", refresh=refresh_llm)
    if check:
        raise typer.Exit(_check_replay(c, ids, llm))
    if jobs > 1 and len(ids) > 1:
        raise typer.Exit(_replay_in_processes(c, llm, c.thread_log.event_counts(ids), jobs, refresh_llm))
    raise typer.Exit(_replay_threads(c, llm, ids))


def _replay_threads(c: Container, llm: CachedLLM, ids: list[str]) -> int:
    """Rebuild `ids`; 1 when any thread's rebuild failed (each is named, with where it failed)."""
    from chatmem.adapters.errors import where_raised
    from chatmem.adapters.procs import process_name
    from chatmem.memory.replay import ReplayFailed

    failed = 0
    for r in c.replay_many(ids, llm, process_name("replay")):
        if isinstance(r, ReplayFailed):
            failed += 1
            console.print(
                f"[red]{r.thread_id}: not rebuilt, {where_raised(r.error)}; its memory is left as it was[/red]"
            )
            continue
        console.print(
            f"{r.thread_id}: generation {r.generation} · {r.events} events · {r.episodes} episodes · {r.seconds:.1f}s"
        )
    console.print(f"LLM calls made: {llm.calls} (the rest came from the cache)")
    if ids:
        # The replaced generations stay in the tables, and reads pay for them, until collected.
        console.print("The replaced generations stay until `chatmem gc` (run it once you keep the rebuild).")
    if failed:
        console.print(f"[red]{failed} of {len(ids)} thread(s) not rebuilt[/red] (the worker logs hold each error)")
    return 1 if failed else 0


def _replay_in_processes(c: Container, llm: CachedLLM, counts: dict[str, int], jobs: int, refresh_llm: bool) -> int:
    """Threads dealt to `jobs` replays, largest first to the least loaded, so they finish
    together: this process takes the first share itself (it has started already; a child
    process pays its start-up first) and a child process each of the others. The exit code is
    the worst of them."""
    import subprocess
    import tempfile

    shares: list[list[str]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for tid, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        k = loads.index(min(loads))
        shares[k].append(tid)
        loads[k] += max(n, 1)
    own, *others = [s for s in shares if s]
    with tempfile.TemporaryDirectory(prefix="chatmem-replay-") as tmp:
        procs = []
        for k, share in enumerate(others):
            listing = Path(tmp) / f"threads-{k}"
            listing.write_text("\n".join(share), encoding="utf-8")
            args = [sys.executable, "-m", "chatmem.api.cli", "replay", "--threads-file", str(listing)]
            procs.append(subprocess.Popen([*args, *(["--refresh-llm"] if refresh_llm else [])]))
        try:
            mine = _replay_threads(c, llm, own)
        except Exception:  # an outage; the children's shares still finish, and the exit code tells
            logging.getLogger("chatmem.replay").exception("replay failed")
            mine = 1
        return max([mine, *(p.wait() for p in procs)])


def _check_replay(c: Container, ids: list[str], llm: CachedLLM) -> int:
    from chatmem.adapters.procs import process_name

    differing = 0
    table = Table(title="replay --check: rows only in the active generation (-) or only in the rebuild (+)")
    for col in ("thread", "projection", "differences"):
        table.add_column(col, overflow="fold")
    for tid in ids:
        diff = c.check_replay(tid, llm, process_name("replay-check"))
        for name, (only_live, only_rebuilt) in diff.items():
            if only_live or only_rebuilt:
                differing += 1
                lines = [f"- {row}" for row in only_live[:5]] + [f"+ {row}" for row in only_rebuilt[:5]]
                more = len(only_live) + len(only_rebuilt) - len(lines)
                table.add_row(tid, name, "\n".join(lines) + (f"\n… {more} more" if more > 0 else ""))
        console.print(f"{tid}: " + ", ".join(f"{n} {len(a) + len(b)} differences" for n, (a, b) in diff.items()))
    if differing:
        console.print(table)
        console.print(
            f"[red]{differing} projection(s) differ[/red] (run it when the workers are idle: pending jobs differ too)"
        )
        return 1
    console.print(f"[green]replay reproduces all {len(ids)} thread(s) exactly[/green]")
    return 0


@app.command()
def reembed(
    provider: str = typer.Option(..., help="minilm, openai or hashing"),
    model: str | None = typer.Option(None, help="the model name (openai)"),
    dim: int | None = typer.Option(None, help="the vector size (openai, hashing)"),
) -> None:
    """Re-embed everything with another embedder: every thread is rebuilt into a new generation
    through replay while reads go on from the current one, then all switch at once, with the
    model. Live projection waits meanwhile (events stay in the log). Rollback: run it again
    with the previous embedder (its vectors are still cached, so it costs no model time) before
    `chatmem gc`. See docs/operations.md."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from chatmem.adapters.embedders import MINILM
    from chatmem.adapters.embedding_state_pg import EmbedderSpec

    if provider == "minilm":
        target = EmbedderSpec("minilm", MINILM, 384)
    elif provider == "openai" and model and dim:
        target = EmbedderSpec("openai", model, dim)
    elif provider == "hashing":
        target = EmbedderSpec("hashing", f"hashing-{dim or 64}", dim or 64)
    else:
        raise typer.BadParameter("--provider minilm | hashing [--dim D] | openai --model M --dim D")
    c = cli_container(cli_settings())
    current = c.embedding_state.spec()
    if current == target:
        console.print(f"already in use: {target.model}")
        return
    console.print(f"re-embedding with {target.model} ({target.dim}-d); in use until the switch: {current.model}")
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} events"))
    with Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("rebuilding", total=None)
        done = c.reembed(target, on_progress=lambda n, total: progress.update(task, completed=n, total=total))
    console.print(
        f"switched to {target.model}: {done['threads']} threads, {done['events']:,} events, "
        f"{done['artifact_texts']:,} attachment texts; `chatmem gc` drops the old generations"
    )


@app.command()
def retention(
    now: str | None = typer.Option(None, help="ISO time to judge expiry at, instead of the clock (for a dry clock)"),
) -> None:
    """Shred the content of events past their retention (CHATMEM_RETENTION_DAYS and
    CHATMEM_RETENTION_DAYS_BY) and rebuild their threads, now; the sweeper queues this job every
    CHATMEM_RETENTION_EVERY_S."""
    from datetime import datetime

    c = cli_container(cli_settings())
    if not c.settings.retention_set:
        console.print("no retention is set (CHATMEM_RETENTION_DAYS, CHATMEM_RETENTION_DAYS_BY): nothing expires")
        return
    at = datetime.fromisoformat(now) if now else None
    removed = c.apply_retention(at)
    console.print("retention: " + ", ".join(f"{k} {n}" for k, n in removed.items()))


@app.command()
def gc() -> None:
    """Delete the rows of generations that a replay replaced."""
    removed = cli_container(cli_settings()).projections.gc()
    console.print("removed " + ", ".join(f"{n} {t}" for t, n in removed.items()))


@app.command("export-schemas")
def export_schemas(check: bool = typer.Option(False, help="fail if the committed files are stale")) -> None:
    """Write the JSON Schema of every event kind to schemas/jsonschema/."""
    from chatmem.schemas.export import write_schemas

    stale = write_schemas(check=check)
    if check and stale:
        console.print(f"[red]stale:[/red] {', '.join(stale)}")
        raise typer.Exit(1)
    console.print("stale: " + ", ".join(stale) if stale else "schemas are current")


@bench_app.command("ingest")
def bench_ingest(
    events: int = typer.Option(100_000, help="events to publish"),
    threads: int = typer.Option(1_000, help="threads they are spread over"),
) -> None:
    """Publish latency, fire-and-forget cost, ingest throughput, next to raw XADD and COPY."""
    from chatmem.bench.ingest import run

    run(cli_settings(), console, n_events=events, n_threads=threads)


@bench_app.command("batches")
def bench_batches(
    dialogues: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo-format file, e.g. locomo_dev.json"),
    texts: int = typer.Option(480, help="turns to embed at each batch size"),
) -> None:
    """CPU per text of the ONNX embedder by batch size and thread count, on real turns."""
    from chatmem.bench.batches import run

    run(console, dialogues, texts=texts)


@bench_app.command("hnsw")
def bench_hnsw(
    vectors: int = typer.Option(100_000, help="vectors to index"),
    kind: str = typer.Option("clustered", help="clustered (around topic centres) or random"),
    config: list[str] = typer.Option(
        None, "--config", help="MEMORY:WORKERS, e.g. 2GB:1 (repeatable; default 64MB:0, 2GB:0, 2GB:1)"
    ),
) -> None:
    """HNSW build time on N message-sized vectors by maintenance_work_mem and parallel workers."""
    from chatmem.bench.hnsw import run

    if kind not in ("clustered", "random"):
        console.print("[red]--kind is clustered or random[/red]")
        raise typer.Exit(2)
    configs = [(m, int(w)) for m, w in (c.split(":") for c in (config or ["64MB:0", "2GB:0", "2GB:1"]))]
    run(cli_settings(), console, n=vectors, kind=kind, configs=configs)


@bench_app.command("pgvector-build")
def bench_pgvector_build(
    vectors: int = typer.Option(100_000, help="vectors in each server"),
    queries: int = typer.Option(50, help="HNSW queries a round"),
    rounds: int = typer.Option(5, help="alternating rounds"),
) -> None:
    """The pgvector compiled here for other CPUs against the package's, side by side."""
    from chatmem.bench.pgvector_build import run

    run(console, n=vectors, queries=queries, rounds=rounds)


@bench_app.command("buffers")
def bench_buffers(
    vectors: int = typer.Option(1_000_000, help="vectors in the graph"),
    size: list[str] = typer.Option(
        None, "--size", help="a shared_buffers value, e.g. 128MB (repeatable; default 128MB and this machine's)"
    ),
    rounds: int = typer.Option(2, help="rounds over the sizes, alternated"),
    batches: int = typer.Option(10, help="timed insert batches per size and round"),
    batch: int = typer.Option(300, help="vectors a batch"),
    searches: int = typer.Option(200, help="timed graph searches per size and round"),
) -> None:
    """HNSW inserts and searches at N vectors by shared_buffers, on a throwaway embedded Postgres."""
    from chatmem.bench.buffers import auto_size, run

    run(
        cli_settings(),
        console,
        n=vectors,
        sizes=size or ["128MB", auto_size()],
        rounds=rounds,
        batches=batches,
        batch=batch,
        searches=searches,
    )


@bench_app.command("topicseg")
def bench_topicseg(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="TIAGE .json or Def-DTS .jsonl"),
    out: Path = typer.Option(None, help="write predictions here, one JSON line per dialogue"),
    baseline: bool = typer.Option(True, help="also score the rule-based segmenter the learned one replaced"),
    llm_assist: bool = typer.Option(
        False,
        "--llm-assist",
        help="also run the learned segmenter with its LLM assist over the configured endpoint (CHATMEM_LLM_*; "
        "answers cached in the database, so a second run asks nothing); its predictions then go to --out",
    ),
    llm_band: float = typer.Option(None, min=0, max=1, help="the assist's band (default: CHATMEM_SEGMENT_LLM_BAND)"),
    weights: Path = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="also score the segmenter with these weights (a retrained scorer, from train-segmenter --out) "
        "as `candidate`, with its paired lead over the shipped weights",
    ),
    closed_thread_bar: float = typer.Option(
        None,
        min=0,
        help="also score the segmenter (with --weights, those) with this closed-thread bar as `candidate` "
        "(1 turns the thanks rules off), with its paired lead over the shipped segmenter",
    ),
    as_written: bool = typer.Option(
        False,
        "--as-written",
        help="read no bot from how the speakers talk: names are taken as written, and a speaker the file "
        "does not name as one is a person",
    ),
) -> None:
    """Topic segmentation with the workers' segmenter: Pk, WD, F1 and Score."""
    from chatmem.adapters.boundary_pair import with_pair_model
    from chatmem.adapters.embedders import minilm_embedder
    from chatmem.bench.topicseg import run
    from chatmem.memory.boundary_llm import Cooldown, LLMBoundaryAssist
    from chatmem.memory.boundary_scorer import BoundaryScorer, shipped_scorer
    from chatmem.memory.segmentation import SegmenterConfig

    settings = cli_settings()
    if llm_assist and not settings.llm_api_key:
        console.print("[red]--llm-assist needs an LLM endpoint: set CHATMEM_LLM_API_KEY (and _BASE_URL, _MODEL)[/red]")
        raise typer.Exit(2)
    candidate = None
    if weights is not None:
        try:
            candidate = BoundaryScorer.from_json(json.loads(weights.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as e:
            console.print(f"[red]{weights} is not a segmenter weights file: {e}[/red]")
            raise typer.Exit(2) from e
        candidate = with_pair_model(candidate, settings.segment_pair_model)
    learned = with_pair_model(shipped_scorer(), settings.segment_pair_model)
    config = None if closed_thread_bar is None else SegmenterConfig(closed_thread_bar=closed_thread_bar)
    embedder = minilm_embedder(settings.embedding_backend)
    if not llm_assist:
        ms: dict[str, float] = {}
        scores = run(
            data,
            out,
            embedder,
            baseline,
            candidate=candidate,
            candidate_config=config,
            learned=learned,
            ms_a_message=ms,
            as_written=as_written,
        )
        _print_topicseg(data.name, scores)
        console.print(
            f"{data.name}: segment step, ms a message (vectors computed before): "
            + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
        )
        return
    c = cli_container(settings)  # the output cache lives in the database
    try:
        llm = c.llm("bench", timeout_s=settings.segment_llm_timeout_s)
        band = settings.segment_llm_band if llm_band is None else llm_band
        assist = LLMBoundaryAssist(llm, band, Cooldown())
        scores = run(data, out, embedder, baseline, assist, candidate, config, learned, as_written=as_written)
        _print_topicseg(data.name, scores)
    finally:
        c.close()
    n = assist.counts
    console.print(
        f"LLM assist ({settings.llm_model}, band {band}): {n.asked} questions, {n.new_topic} new topic, "
        f"{n.same_topic} same topic, {n.failed} failed, {n.skipped} left to the scorer after a failure; "
        f"{llm.calls} answered by the endpoint, the rest from the cache"
    )


def _print_topicseg(name: str, scores: dict) -> None:
    from chatmem.bench.stats import paired

    for segmenter, s in scores.items():
        if not s.dialogues:
            console.print(f"{name} ({segmenter}): no dialogue of two utterances or more to score")
            continue
        console.print(
            f"{name} ({segmenter}): Pk {s.pk:.3f} · WD {s.wd:.3f} · F1 {s.f1:.3f} · "
            f"Score {s.interval().text('dialogues')}"
        )
    for a, b in (("learned+llm", "learned"), ("candidate", "learned"), ("learned", "bag"), ("learned", "rules")):
        if a in scores and b in scores and scores[a].dialogues:
            diff = paired(scores[a].dialogues, scores[b].dialogues)
            console.print(f"{name}: {a} − {b}, Score {diff.text('dialogues, paired', sign=True)}")


@bench_app.command("train-segmenter")
def bench_train_segmenter(
    data: Path = typer.Option(..., exists=True, file_okay=False, help="folder with TIAGE and SuperDialseg files"),
    cache: Path = typer.Option(Path(".chatmem/segmenter"), help="embedding cache and the held-out sets written"),
    out: Path = typer.Option(None, help="weights file (default: the one shipped in chatmem.memory)"),
) -> None:
    """Train the segmenter's boundary scorer (fixed seed) and write its weights."""
    from chatmem.adapters.embedders import minilm_embedder
    from chatmem.bench.train_segmenter import run

    settings = cli_settings()
    run(data, cache, out, minilm_embedder(settings.embedding_backend), console.print)


@bench_app.command("train-speakers")
def bench_train_speakers(
    data: Path = typer.Option(..., exists=True, file_okay=False, help="folder with TIAGE and SuperDialseg files"),
    out: Path = typer.Option(None, help="weights file (default: the one shipped in chatmem.bench)"),
) -> None:
    """Fit the model that reads which of two speakers is a bot, for files that do not say."""
    from chatmem.bench.train_speakers import run

    run(data, out, console.print)


@bench_app.command("train-pair")
def bench_train_pair(
    data: Path = typer.Option(..., exists=True, file_okay=False, help="folder with TIAGE's anno_train.json"),
    cache: Path = typer.Option(Path(".chatmem/segmenter"), help="where the out-of-fold logits are written"),
    out: Path = typer.Option(None, help="ONNX file written (default: the one shipped in chatmem.adapters)"),
    epochs: int = typer.Option(3, min=1, help="passes over the candidates"),
    limit: int = typer.Option(None, min=2, help="only the first N dialogues (a quick check)"),
) -> None:
    """Fine-tune the segmenter's pair model among people (fixed seed; needs the `export` extra: torch),
    write its ONNX file and its out-of-fold logits for `train-segmenter`."""
    from chatmem.adapters.embedders import torch_available
    from chatmem.bench.train_pair import run

    cli_settings()
    if not torch_available():
        console.print("[red]fine-tuning the pair model needs torch: pip install -e '.\\[export]'[/red]")
        raise typer.Exit(2)
    run(data, cache, console.print, out, epochs=epochs, limit=limit)


@bench_app.command("recall-latency")
def bench_recall_latency(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo-format JSON"),
    keep: Path = typer.Option(None, file_okay=False, help="as for `bench locomo`: reuse a processed database"),
    rounds: int = typer.Option(3, min=1, help="passes over the questions, per way"),
) -> None:
    """Recall p50/p95 with the turn search's query vector three ways, and the shipped way with the
    heap frozen as the servers freeze it, interleaved in one run."""
    from chatmem.bench.recall_latency import run

    run(cli_settings(), console, data, keep, rounds)


@bench_app.command("train-ranker")
def bench_train_ranker(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo JSON with questions and evidence"),
    out: Path = typer.Option(None, help="weights file (default: the one shipped in chatmem.memory)"),
    keep: Path = typer.Option(None, file_okay=False, help="as for `bench locomo`: reuse a processed database"),
    sample: list[str] = typer.Option(None, "--sample", help="only these sample ids (repeatable)"),
    query_encoder: bool = typer.Option(
        True, help="also fine-tune the recall query encoder (needs the `export` extra: torch) and rank with it"
    ),
    query_out: Path = typer.Option(None, help="query encoder file (default: the one shipped in chatmem.adapters)"),
) -> None:
    """Train the recall ranker (fixed seed) on LoCoMo questions, print its cross-validation, write its weights;
    first fine-tune the query encoder it ranks with (fixed seed)."""
    from chatmem.adapters.embedders import QUERY_ONNX_FILE, torch_available
    from chatmem.bench.train_ranker import default_out, run

    if query_encoder and not torch_available():
        console.print(
            "[red]fine-tuning the query encoder needs torch: pip install -e '.\\[export]' "
            "(or --no-query-encoder to train the ranker alone)[/red]"
        )
        raise typer.Exit(2)
    run(
        cli_settings(),
        console,
        data,
        out or default_out(),
        keep,
        set(sample) if sample else None,
        query_out=(query_out or QUERY_ONNX_FILE) if query_encoder else None,
    )


@bench_app.command("export-onnx")
def bench_export_onnx(
    data: Path = typer.Option(
        Path("../shared/eval"), exists=True, file_okay=False, help="eval folder (LoCoMo, topicseg)"
    ),
    out: Path = typer.Option(None, help="ONNX file written (default: the one shipped in chatmem.adapters)"),
    report: Path = typer.Option(None, help="also write the figures here as JSON"),
) -> None:
    """Export all-MiniLM-L6-v2 to ONNX from the packaged weights (needs the `export` extra),
    check it against the torch path on 1,000 dialogue texts, and write the smallest file that holds."""
    import json

    from chatmem.bench.export_onnx import default_output, run

    cli_settings()
    figures = run(data, out or default_output(), console.print)
    if report is not None:
        report.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


@bench_app.command("model-reference")
def bench_model_reference() -> None:
    """Record the shipped ONNX models' outputs on fixed probes, which `chatmem status` and the suite
    compare each machine's with (adapters/model_check.py). Run after a model file changes."""
    from chatmem.adapters.model_check import MODELS, write_reference

    cli_settings()
    console.print(f"wrote {write_reference()}: the outputs of {', '.join(MODELS)}")


@bench_app.command("pipeline")
def bench_pipeline(
    messages: int = typer.Option(2000, help="messages to publish"),
    threads: int = typer.Option(20, help="threads they are spread over (generated conversation)"),
    dialogues: Path | None = typer.Option(
        None, help="LoCoMo-format file: its conversations instead of a generated one (e.g. locomo_dev.json)"
    ),
    preload: int = typer.Option(
        0, help="then load this many messages with their HNSW graph and run live again, side by side (e.g. 1000000)"
    ),
) -> None:
    """End-to-end messages/s next to the raw embedding rate; replay rate next to the live rate."""
    from chatmem.bench.pipeline import run

    if preload and dialogues:
        console.print("[red]--preload compares two generated conversations; leave out --dialogues[/red]")
        raise typer.Exit(2)
    run(cli_settings(), console, n_messages=messages, n_threads=threads, dialogues=dialogues, preload=preload)


@bench_app.command("attachments")
def bench_attachments(
    images: int = typer.Option(20, help="images OCR'd in the throughput run"),
    pages: int = typer.Option(40, help="pages of the generated PDF"),
    flood: int = typer.Option(40, help="images queued while messages are timed"),
    messages: int = typer.Option(100, help="messages timed"),
    rate: float = typer.Option(10.0, help="messages published per second"),
) -> None:
    """OCR images/s, document pages/s, and message latency while attachments flood in."""
    from chatmem.bench.attachments import run

    run(cli_settings(), console, images=images, pages=pages, flood=flood, messages=messages, rate=rate)


@bench_app.command("documents")
def bench_documents(
    sections: int = typer.Option(60, help="sections of the text (a heading, 5 paragraphs, a table each)"),
    rows: int = typer.Option(2000, help="rows of the spreadsheet"),
    slides: int = typer.Option(60, help="slides of the presentation"),
    rounds: int = typer.Option(7, help="reads of each file"),
) -> None:
    """Reading a document in each format, the same content as Word, Excel and PowerPoint files
    and as OpenDocument ones, side by side."""
    from chatmem.bench.documents import run

    run(console, sections=sections, rows=rows, slides=slides, rounds=rounds)


@bench_app.command("facts")
def bench_facts(
    facts: int = typer.Option(10_000, help="facts to write"),
    users: int = typer.Option(100, help="users they belong to"),
) -> None:
    """Facts written per second; mem0 search latency next to a direct pgvector query."""
    from chatmem.bench.facts import run

    run(cli_settings(), console, n_facts=facts, n_users=users)


@bench_app.command("locomo")
def bench_locomo(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo JSON"),
    out: Path = typer.Option(None, help="write predictions here (JSON Lines)"),
    sample: list[str] = typer.Option(None, "--sample", help="only these sample ids (repeatable)"),
    keep: Path = typer.Option(
        None, file_okay=False, help="run the services under this folder and keep them: a re-run only asks the questions"
    ),
    linear: bool = typer.Option(False, "--linear", help="rank turns by the hand-tuned rule, not the shipped model"),
    bundles: bool = typer.Option(
        False, "--bundles", help="also the evidence build_context's bundle quotes at 8,000, 4,000 and 2,000 tokens"
    ),
) -> None:
    """Evidence recall@5/10/25 and full@10 per question category through the whole pipeline."""
    from chatmem.bench.locomo import BUNDLE_TOTALS, run

    ranker = "linear" if linear else "learned"
    totals = BUNDLE_TOTALS if bundles else ()
    run(cli_settings(), console, data, out, set(sample) if sample else None, keep, ranker, totals)


@bench_app.command("deletions")
def bench_deletions(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo JSON"),
    sample: str = typer.Option("conv-26", help="the conversation to process and delete from"),
    rounds: int = typer.Option(6, min=2, help="deletions, alternating the two ways"),
    keep: Path = typer.Option(None, file_okay=False, help="run the services under this folder and keep them"),
) -> None:
    """LLM requests and wall time to forget one deleted message, outputs dropped first vs kept."""
    from chatmem.bench.deletions import run

    run(cli_settings(), console, data, sample, rounds, keep)


@bench_app.command("context")
def bench_context(
    messages: int = typer.Option(1_000_000, help="messages to bulk-load"),
    threads: int = typer.Option(10_000, help="threads they are spread over"),
    users: int = typer.Option(2_000, help="users the threads belong to"),
    queries: int = typer.Option(300, help="queries to time"),
    hnsw: bool = typer.Option(False, help="also build the messages' HNSW index (long on 2 cores)"),
) -> None:
    """build_context and recall latency p50/p95 next to mem0's own search, same Postgres, same run."""
    from chatmem.bench.context import run

    run(
        cli_settings(),
        console,
        n_messages=messages,
        n_threads=threads,
        n_users=users,
        n_queries=queries,
        with_hnsw=hnsw,
    )


@bench_app.command("tokens")
def bench_tokens(
    data: list[Path] = typer.Option(..., "--data", exists=True, dir_okay=False, help="dialogue files (repeatable)"),
) -> None:
    """The token estimate next to tiktoken (when its encodings are on this machine)."""
    from chatmem.bench.tokens import run

    cli_settings()
    run(console, data)


@bench_app.command("import")
def bench_import(
    messages: int = typer.Option(200_000, min=1, help="messages in each generated export (Telegram, WhatsApp)"),
) -> None:
    """`chatmem import telegram` and `import whatsapp` messages/s next to the raw publish rate; peak memory."""
    from chatmem.bench.importer import run

    run(cli_settings(), console, n_messages=messages)


@bench_app.command("soak")
def bench_soak(
    minutes: float = typer.Option(10.0, min=0.5, help="how long the load runs"),
    rate: float = typer.Option(10.0, min=1, help="messages per second"),
    threads: int = typer.Option(50, min=1, help="threads the messages go to"),
) -> None:
    """A steady mixed load on the whole stack; RSS per process, lag, queues and read latency over time."""
    from chatmem.bench.soak import run

    run(cli_settings(), console, minutes=minutes, rate=rate, threads=threads)


cli_read.register(app)


def main() -> None:
    from chatmem.adapters.pgcheck import VectorSupportError
    from chatmem.adapters.services import ServiceUnavailable

    printable_output()
    try:
        app()
    except (ServiceUnavailable, VectorSupportError) as error:
        # A service that cannot be used is the user's to fix: the message, never a traceback.
        console.print(f"[red]{error}[/red]")
        sys.exit(1)


if __name__ == "__main__":
    main()
