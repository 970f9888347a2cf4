"""`chatmem bench import`: how fast a chat export goes in, next to the raw publish rate of the same
machine, measured in the same run. Printed, never asserted.

A synthetic Telegram Desktop export (one chat's result.json with replies, entity lists, photos,
files that were not exported, service messages, edits and forwards) is written to a temporary
folder, then timed three ways:
  - raw publish: Publisher.publish_many of the export's events, built beforehand;
  - parse: the Telegram parser turning the file into events, nothing published;
  - import: `chatmem import telegram` as a user runs it, in a process of its own (parse, the
    known-ids check against Postgres, publish), with that process's peak memory.
A WhatsApp export (Android's format: 12-hour times, multi-line texts, photos, "<Media omitted>",
system lines), a Slack workspace export (day files of three channels: mentions, links, thread
replies, files, joins) and a Messenger export (conversations cut into files newest first, texts
written byte by byte as Meta writes them) of as many messages are timed the same two ways, parse
and import.
Then the cost of reading through LoneSurrogatesReplaced (half an emoji in an export), parse only,
on a smaller export as written, ASCII-escaped with emoji, and escaped with some emoji cut in half.
Runs in the scratch database and Redis db of `bench ingest`, removed at the end."""

from __future__ import annotations

import io
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from PIL import Image
from rich.console import Console
from rich.table import Table

from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.producers.import_meta import MetaOptions, find_meta_exports, meta_items
from chatmem.producers.import_slack import find_slack_exports, read_workspace, slack_items
from chatmem.producers.import_telegram import TelegramOptions, telegram_items
from chatmem.producers.import_whatsapp import WhatsAppOptions, whatsapp_items
from chatmem.producers.importers import LoneSurrogatesReplaced
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.schemas.settings import Settings

CHAT_ID = 1234567890
AUTHORS = [("Maya", "user1001"), ("Leo", "user1002"), ("Ana", "user1003"), ("TripBot", "user1999")]
WORDS = (
    "the a to and of we I you it is for on that this with be at have are not can what so do "
    "trip Lisbon hotel flight Friday dinner book booked tomorrow tonight train museum tickets "
    "price cheap late early morning evening beach castle tram coffee pastry sunny rain plan "
    "maybe sure thanks great idea photo map bag passport time meet station airport check"
).split()
NOT_INCLUDED = "(File not included. Change data exporting settings to download.)"
PHOTOS = 5


def write_telegram_export(folder: Path, n_messages: int, seed: int = 7) -> Path:
    """A result.json of `n_messages` messages, written as a stream (memory stays flat)."""
    rng = random.Random(seed)
    (folder / "photos").mkdir(parents=True, exist_ok=True)
    for k in range(PHOTOS):
        Image.new("RGB", (32, 24), (40 * k, 120, 200)).save(folder / "photos" / f"photo_{k}.jpg")
    path = folder / "result.json"
    unix = 1_700_000_000
    with open(path, "w", encoding="utf-8") as out:
        out.write(f'{{\n "name": "Trip planning",\n "type": "private_group",\n "id": {CHAT_ID},\n "messages": [')
        for i in range(1, n_messages + 1):
            unix += rng.randint(5, 900)
            message = _message(rng, i, unix)
            out.write(("," if i > 1 else "") + "\n  " + json.dumps(message, ensure_ascii=False))
        out.write("\n ]\n}\n")
    return path


def write_whatsapp_export(folder: Path, n_messages: int, seed: int = 7) -> Path:
    """An Android "WhatsApp Chat with Trip planning.txt" of `n_messages` messages, streamed."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    local = datetime(2023, 1, 2, 8, 0)
    path = folder / "WhatsApp Chat with Trip planning.txt"
    with open(path, "w", encoding="utf-8") as out:
        for i in range(1, n_messages + 1):
            local += timedelta(seconds=rng.randint(5, 900))
            stamp = f"{local.month}/{local.day}/{local:%y}, {local:%I}:{local:%M}\u202f{local:%p}".replace(" 0", " ")
            name = AUTHORS[rng.randrange(len(AUTHORS))][0]
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))
            if i % 311 == 0:
                out.write(f"{stamp} - {name} added Ana\n")
                continue
            if i % 500 == 0:
                photo = f"IMG-{local:%Y%m%d}-WA{i:04d}.jpg"
                Image.new("RGB", (32, 24), (i % 255, 120, 200)).save(folder / photo)
                text = f"{photo} (file attached)\n{text}"
            elif i % 700 == 0:
                text = "<Media omitted>"
            elif i % 9 == 0:
                text += "\n" + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
            out.write(f"{stamp} - {name}: {text}\n")
    return path


def _message(rng: random.Random, i: int, unix: int) -> dict[str, Any]:
    # Telegram writes the exporter's local time in "date"; here UTC+3, to keep the importer honest.
    local = (datetime.fromtimestamp(unix, UTC) + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S")
    name, from_id = AUTHORS[rng.randrange(len(AUTHORS))]
    if i % 311 == 0:
        return {
            "id": i,
            "type": "service",
            "date": local,
            "date_unixtime": str(unix),
            "actor": name,
            "actor_id": from_id,
            "action": "pin_message",
            "message_id": max(1, i - 3),
            "text": "",
            "text_entities": [],
        }
    words = " ".join(rng.choice(WORDS) for _ in range(rng.choice((3, 6, 10, 18, 40))))
    text: str | list[Any] = words
    entities: list[dict[str, str]] = [{"type": "plain", "text": words}]
    if i % 6 == 0:
        head, _, tail = words.partition(" ")
        entities = [{"type": "bold", "text": head}, {"type": "plain", "text": " " + tail}]
        text = [entities[0], entities[1]["text"]]
    message: dict[str, Any] = {
        "id": i,
        "type": "message",
        "date": local,
        "date_unixtime": str(unix),
        "from": name,
        "from_id": from_id,
    }
    if i % 8 == 0:
        message["reply_to_message_id"] = max(1, i - rng.randint(1, 20))
    if i % 50 == 0:
        message["edited"] = local
        message["edited_unixtime"] = str(unix + 60)
    if i % 997 == 0:
        message["forwarded_from"] = "Lisbon Guide"
    if i % 500 == 0:
        message.update(photo=f"photos/photo_{i % PHOTOS}.jpg", photo_file_size=900, width=32, height=24)
    elif i % 700 == 0:
        message.update(file=NOT_INCLUDED, media_type="voice_message", mime_type="audio/ogg", duration_seconds=4)
    message["text"] = text
    message["text_entities"] = entities
    return message


def _cli(env: dict[str, str], *args: str) -> tuple[float, int, int | None]:
    """(seconds, exit status, peak RSS in bytes or None) of one `chatmem` process.

    The peak is the process's VmHWM, sampled from /proc: its rusage would not do, as Linux folds
    the parent's resident size at fork (this bench holds every event) into the child's maxrss."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatmem.api.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak: int | None = None
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text(encoding="utf-8").splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass  # not Linux, or the process is gone
        time.sleep(0.05)
    return time.perf_counter() - started, proc.returncode, peak


def run(settings: Settings, console: Console, *, n_messages: int = 200_000) -> dict[str, float]:
    with scratch(settings) as c, tempfile.TemporaryDirectory(prefix="chatmem-bench-import-") as tmp:
        console.print(f"[bold]bench import[/bold]: writing a {n_messages:,}-message Telegram export")
        export = write_telegram_export(Path(tmp), n_messages)
        size = export.stat().st_size
        options = TelegramOptions(max_text_chars=c.settings.max_text_chars)

        started = time.perf_counter()
        with open(export, "rb") as fh:  # read as the import reads it
            items = telegram_items(LoneSurrogatesReplaced(fh), export.parent, options)
            events = [e for e in items if isinstance(e, MessageEvent)]
        parse_s = time.perf_counter() - started

        pub = Publisher.from_settings(c.settings, c.urls.redis_url)
        started = time.perf_counter()
        for i in range(0, len(events), 1000):
            pub.publish_many(events[i : i + 1000])
        publish_s = time.perf_counter() - started
        pub.close()
        n_events = len(events)
        del events
        c.redis.delete(c.settings.stream_key)

        env = c.settings.as_env()
        startup_s, _, _ = _cli(env, "import", "telegram", "--help")
        import_s, status, peak_rss = _cli(env, "import", "telegram", str(export))
        published = int(c.redis.xlen(c.settings.stream_key))
        c.redis.delete(c.settings.stream_key)

        others = {
            "whatsapp": _time_format(c, console, "whatsapp", Path(tmp) / "whatsapp", n_messages),
            "slack": _time_format(c, console, "slack", Path(tmp) / "slack", n_messages),
            "messenger": _time_format(c, console, "messenger", Path(tmp) / "messenger", n_messages),
        }

    figures = {
        "messages": float(n_messages),
        "events": float(n_events),
        "export_bytes": float(size),
        "raw_publish_per_s": n_events / publish_s,
        "parse_per_s": n_messages / parse_s,
        "import_per_s": n_messages / import_s,
        "import_s": import_s,
        "cli_startup_s": startup_s,
        "import_peak_rss_bytes": float(peak_rss or "nan"),
        "import_published": float(published),
        "import_exit_status": float(status),
    }
    for name, other in others.items():
        figures |= {
            f"{name}_events": float(other.events),
            f"{name}_export_bytes": float(other.size),
            f"{name}_parse_per_s": n_messages / other.parse_s,
            f"{name}_import_per_s": n_messages / other.import_s,
            f"{name}_import_peak_rss_bytes": float(other.peak or "nan"),
            f"{name}_import_published": float(other.published),
            f"{name}_import_exit_status": float(other.status),
        }
    table = Table(
        title=f"chatmem bench import · {machine()} · {datetime.now(UTC):%Y-%m-%d}",
        caption=f"{platform.platform()} · Python {platform.python_version()}",
    )
    for col in ("measure", "messages/s", "time", "note"):
        table.add_column(col)
    table.add_row(
        "raw publish_many (prebuilt events)",
        f"{figures['raw_publish_per_s']:,.0f}",
        f"{publish_s:.1f} s",
        f"{n_events:,} events, batches of 1,000",
    )
    table.add_row(
        "parse only (Telegram → events)",
        f"{figures['parse_per_s']:,.0f}",
        f"{parse_s:.1f} s",
        f"{size / 1e6:,.0f} MB export",
    )
    table.add_row(
        "chatmem import telegram (end to end)",
        f"{figures['import_per_s']:,.0f}",
        f"{import_s:.1f} s",
        f"incl. {startup_s:.1f} s CLI start-up; {published:,} published; exit {status}",
    )
    for name, other in others.items():
        table.add_row(
            f"parse only ({_TITLES[name]} → events)",
            f"{figures[f'{name}_parse_per_s']:,.0f}",
            f"{other.parse_s:.1f} s",
            f"{other.size / 1e6:,.0f} MB export"
            + (", read twice (date order, then messages)" if name == "whatsapp" else ""),
        )
        table.add_row(
            f"chatmem import {name} (end to end)",
            f"{figures[f'{name}_import_per_s']:,.0f}",
            f"{other.import_s:.1f} s",
            f"{other.published:,} published of {other.events:,} events; exit {other.status}",
        )
    console.print(table)
    peaks = [("telegram", peak_rss, size)] + [(name, o.peak, o.size) for name, o in others.items()]
    for name, rss, export_size in peaks:
        peak = f"{rss / 2**20:,.0f} MiB" if rss else "not measured (no /proc)"
        console.print(
            f"peak memory of the {name} import process: {peak} (VmHWM) for a {export_size / 2**20:,.0f} MiB export"
        )
    figures.update(reader_cost(console))
    return figures


_TITLES = {"whatsapp": "WhatsApp", "slack": "Slack", "messenger": "Messenger"}


@dataclass
class _FormatRun:
    size: int
    events: int
    parse_s: float
    import_s: float
    status: int
    peak: int | None
    published: int


def _time_format(c: Any, console: Console, name: str, folder: Path, n_messages: int) -> _FormatRun:
    """Write a `name` export of n_messages, parse it in this process, then import it with the CLI."""
    console.print(f"[bold]bench import[/bold]: writing a {n_messages:,}-message {_TITLES[name]} export")
    if name == "whatsapp":
        export = write_whatsapp_export(folder, n_messages)
        files, size = [export], export.stat().st_size
        options = WhatsAppOptions(chat="Trip planning", zone=UTC, max_text_chars=c.settings.max_text_chars)
        parse: Any = lambda fh, where: whatsapp_items(fh, where, options)  # noqa: E731
        args = [str(export), "--timezone", "UTC"]
    elif name == "messenger":
        export = write_meta_export(folder, n_messages)
        files = find_meta_exports(export, "messenger")
        size = sum(f.stat().st_size for f in files)
        meta_options = MetaOptions(max_text_chars=c.settings.max_text_chars)
        parse = lambda fh, where: meta_items(fh, where, meta_options)  # noqa: E731
        args = [str(export)]
    else:
        export = write_slack_export(folder, n_messages)
        files = find_slack_exports(export)
        size = sum(f.stat().st_size for f in files)
        workspace = read_workspace(export)
        parse = lambda fh, where: slack_items(fh, where, workspace)  # noqa: E731
        args = [str(export)]
    started = time.perf_counter()
    events = 0
    for file in files:
        with open(file, "rb") as fh:
            events += sum(isinstance(e, MessageEvent) for e in parse(fh, file.parent))
    parse_s = time.perf_counter() - started
    import_s, status, peak = _cli(c.settings.as_env(), "import", name, *args)
    published = int(c.redis.xlen(c.settings.stream_key))
    c.redis.delete(c.settings.stream_key)
    return _FormatRun(size, events, parse_s, import_s, status, peak, published)


def write_meta_export(folder: Path, n_messages: int, seed: int = 7) -> Path:
    """A Messenger export (the newer layout) of n_messages in conversations of up to 20,000, each
    cut into files of 5,000 listed newest first, every text written as Meta writes it (each
    UTF-8 byte a character), some with accents and emoji."""
    rng = random.Random(seed)
    inbox = folder / "your_facebook_activity" / "messages" / "inbox"
    written, conversation = 0, 0
    stamp = 1_700_000_000_000
    while written < n_messages:
        count = min(20_000, n_messages - written)
        thread = inbox / f"tripplanning_{conversation:06d}"
        thread.mkdir(parents=True)
        messages = []
        for i in range(count):
            stamp += rng.randint(5_000, 900_000)
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))
            if i % 3 == 0:
                text += " café ☕"
            sender = AUTHORS[rng.randrange(len(AUTHORS))][0]
            messages.append({"sender_name": sender, "timestamp_ms": stamp, "content": text.encode().decode("latin-1")})
        messages.reverse()  # newest first, and message_1.json the newest
        for number, start in enumerate(range(0, count, 5_000), start=1):
            doc = {
                "participants": [{"name": a} for a, _ in AUTHORS],
                "title": "Trip planning",
                "thread_path": f"inbox/{thread.name}",
                "messages": messages[start : start + 5_000],
            }
            (thread / f"message_{number}.json").write_text(json.dumps(doc), encoding="utf-8")
        written += count
        conversation += 1
    return folder


def write_slack_export(folder: Path, n_messages: int, seed: int = 7) -> Path:
    """A workspace export of three channels and n_messages, 400 a day file: mentions, links,
    thread replies, files (with the token their links carry), joins and bot posts."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    users = [
        {"id": f"U{k:04d}", "name": name.lower(), "profile": {"display_name": name}}
        for k, (name, _) in enumerate(AUTHORS)
    ]
    channels = [{"id": f"C{k:04d}", "name": name} for k, name in enumerate(("general", "trip", "random"))]
    (folder / "users.json").write_text(json.dumps(users), encoding="utf-8")
    (folder / "channels.json").write_text(json.dumps(channels), encoding="utf-8")
    ts = 1_700_000_000.0
    per_day, written = 400, 0
    day = datetime(2023, 11, 14)
    while written < n_messages:
        channel = channels[(written // per_day) % len(channels)]["name"]
        (folder / channel).mkdir(exist_ok=True)
        messages: list[dict[str, Any]] = []
        for i in range(min(per_day, n_messages - written)):
            ts += rng.randint(5, 200)
            user = users[rng.randrange(len(users))]["id"]
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))
            message: dict[str, Any] = {"type": "message", "ts": f"{ts:.6f}", "user": user, "text": text}
            if i % 7 == 0:
                message["text"] += f" <@{users[0]['id']}> <https://example.com/{i}|the link> &amp; more"
            if i % 5 == 0 and messages:
                message["thread_ts"] = messages[-1]["ts"]
            if i % 97 == 0:
                message["subtype"], message["text"] = "channel_join", f"<@{user}> has joined the channel"
            if i % 150 == 0:
                message["files"] = [
                    {
                        "name": "plan.pdf",
                        "mimetype": "application/pdf",
                        "url_private": "https://files.slack.com/files-pri/T1-F1/plan.pdf?t=xoxe-1-2-3-abc",
                    }
                ]
            messages.append(message)
        (folder / channel / f"{day:%Y-%m-%d}.json").write_text(json.dumps(messages, indent=1), encoding="utf-8")
        written += len(messages)
        day += timedelta(days=1)
    return folder


def reader_cost(console: Console, n_messages: int = 40_000, rounds: int = 7) -> dict[str, float]:
    """Parse only, the file read directly and through LoneSurrogatesReplaced, alternated, the
    fastest of `rounds` each. Escaped files are what exporters writing ASCII-only JSON produce:
    every emoji is a pair of escapes, which the reader has to look at."""
    with tempfile.TemporaryDirectory(prefix="chatmem-bench-reader-") as tmp:
        doc = json.loads(write_telegram_export(Path(tmp), n_messages).read_bytes())
    emoji = ["\U0001f600", "\U0001f44d", "\u2615", "\U0001f3d6"]
    rng = random.Random(3)
    for message in doc["messages"]:
        if isinstance(message["text"], str) and message["text"]:
            message["text"] += " " + rng.choice(emoji)
    cut = json.loads(json.dumps(doc))
    for message in cut["messages"][::100]:
        if isinstance(message["text"], str):
            message["text"] += " \ud83d"  # cut after the first half
    files = {
        "as written (UTF-8)": json.dumps(doc, ensure_ascii=False, indent=1).encode(),
        "ASCII-escaped, an emoji a message": json.dumps(doc, indent=1).encode(),
        "escaped, and 1 message in 100 ending in half an emoji": json.dumps(cut, indent=1).encode(),
    }
    when = f"{machine()} · {datetime.now(UTC):%Y-%m-%d}"
    table = Table(title=f"reading through LoneSurrogatesReplaced, parse only · {when}")
    for col in ("file", "MB", "direct", "through the reader", "ratio"):
        table.add_column(col)
    figures = {}
    for name, raw in files.items():
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for through in (False, True):
                times[through].append(_parse_seconds(raw, through))
        direct, wrapped = min(times[False]), min(times[True])
        table.add_row(name, f"{len(raw) / 1e6:.1f}", f"{direct:.3f} s", f"{wrapped:.3f} s", f"{wrapped / direct:.3f}")
        figures[f"reader_ratio {name}"] = wrapped / direct
    console.print(table)
    return figures


def _parse_seconds(raw: bytes, through: bool) -> float:
    fh = io.BytesIO(raw)
    started = time.perf_counter()
    for _ in telegram_items(LoneSurrogatesReplaced(fh) if through else fh, Path(".")):
        pass
    return time.perf_counter() - started
