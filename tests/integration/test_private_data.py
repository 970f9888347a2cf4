"""The data folder holds conversations, so other local users get nothing: the folder is its
user's alone, and the embedded Redis, which every local user can reach on 127.0.0.1, asks for a
password that only that user can read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis

from chatmem.adapters.services import EmbeddedRedis
from chatmem.bootstrap import Container
from chatmem.schemas.settings import Settings

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
