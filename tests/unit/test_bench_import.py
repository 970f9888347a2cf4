"""The exports `chatmem bench import` writes are what the importers read: every message is an
event or a skip the generator meant, so the bench times real work."""

from datetime import UTC

from chatmem.bench.importer import write_meta_export, write_slack_export, write_whatsapp_export
from chatmem.producers.import_meta import MetaOptions, find_meta_exports, meta_items
from chatmem.producers.import_slack import find_slack_exports, read_workspace, slack_items
from chatmem.producers.import_whatsapp import WhatsAppOptions, whatsapp_items
from chatmem.producers.importers import AttachmentSkipped, Failed, Skipped
from chatmem.schemas.events import MessageEvent


def test_the_generated_whatsapp_export_reads_whole(tmp_path):
    export = write_whatsapp_export(tmp_path, 1500)
    with open(export, "rb") as fh:
        items = list(whatsapp_items(fh, export.parent, WhatsAppOptions(chat="Trip planning", zone=UTC)))
    events = [i for i in items if isinstance(i, MessageEvent)]
    assert not [i for i in items if isinstance(i, Failed)]
    assert len(events) + sum(isinstance(i, Skipped) for i in items) == 1500
    assert sum(len(e.attachments) for e in events) == 3  # messages 500, 1000 and 1500
    assert sum("\n" in e.text for e in events) > 100  # texts over several lines


def test_the_generated_slack_export_reads_whole(tmp_path):
    root = write_slack_export(tmp_path, 1500)
    workspace = read_workspace(root)
    items = []
    for file in find_slack_exports(root):
        with open(file, "rb") as fh:
            items += list(slack_items(fh, file.parent, workspace))
    events = [i for i in items if isinstance(i, MessageEvent)]
    assert not [i for i in items if isinstance(i, Failed)]
    assert len(events) + sum(isinstance(i, Skipped) for i in items) == 1500
    assert sum(isinstance(i, AttachmentSkipped) for i in items) > 0
    assert {e.thread_id for e in events} == {"slack:C0000", "slack:C0001", "slack:C0002"}
    assert any(e.reply_to for e in events) and any("@Maya" in e.text for e in events)


def test_the_generated_messenger_export_reads_whole_and_in_order(tmp_path):
    root = write_meta_export(tmp_path, 12_000)
    files = find_meta_exports(root, "messenger")
    assert len(files) == 3
    events = []
    for file in files:
        with open(file, "rb") as fh:
            events += [i for i in meta_items(fh, file.parent, MetaOptions()) if isinstance(i, MessageEvent)]
    assert len(events) == 12_000
    assert [e.occurred_at for e in events] == sorted(e.occurred_at for e in events)
    assert sum("café ☕" in e.text for e in events) == 4_000
