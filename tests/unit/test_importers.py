"""The LoCoMo mapping: one thread per sample, a message per turn, ids and times as documented."""

from datetime import UTC, datetime, timedelta

from chatmem.producers.importers import locomo_events
from tests.locomo_sample import write_sample


def test_locomo_turns_become_message_events(tmp_path):
    events = list(locomo_events(write_sample(tmp_path)))
    assert [e.platform_message_id for e in events] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3"]
    assert {e.thread_id for e in events} == {"conv-test"} and {e.role for e in events} == {"user"}
    assert [e.user_id for e in events[:2]] == ["Maya", "Leo"]
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert [e.occurred_at for e in events[:4]] == [start + timedelta(seconds=i) for i in range(4)]
    assert events[4].occurred_at == datetime(2023, 6, 20, 10, 15, tzinfo=UTC)
    image = events[3]
    assert image.attachments[0].caption == "a photo of a red road bicycle leaning on a wall"
    assert image.attachments[0].url.startswith("https://") and image.metadata["img_url"] == "http://x/b.jpg"
    assert events[0].metadata["author_name"] == "Maya"
    assert len({e.event_id for e in events}) == 7  # derived from the turn: a re-import dedupes


def test_only_selected_samples(tmp_path):
    assert list(locomo_events(write_sample(tmp_path), {"other"})) == []
