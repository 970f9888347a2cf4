"""A service URL as it is printed and logged: the password never, the rest as given."""

import pytest

from chatmem.adapters.services import shown


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://chatmem:hunter2@db:5432/chatmem", "postgresql://chatmem:***@db:5432/chatmem"),
        ("redis://:hunter2@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://default:p%40ss@cache.example:6380/1", "rediss://default:***@cache.example:6380/1"),
        ("postgresql://u:p@ss@db/x", "postgresql://u:***@db/x"),  # an unencoded @ leaves no tail
        (
            "postgresql://db/x?user=u&password=hunter2&sslmode=require",
            "postgresql://db/x?user=u&password=***&sslmode=require",
        ),
        ("host=db dbname=x password='a b c' user=u", "host=db dbname=x password=*** user=u"),
        ("host=db password=hunter2", "host=db password=***"),
        # Nothing secret: as given (the embedded server's URL has an empty password).
        ("postgresql://postgres:@/chatmem?host=/tmp/x", "postgresql://postgres:@/chatmem?host=/tmp/x"),
        ("redis://127.0.0.1:42939/0", "redis://127.0.0.1:42939/0"),
        ("postgresql://chatmem@db/chatmem", "postgresql://chatmem@db/chatmem"),
    ],
)
def test_a_password_is_never_shown(url, expected):
    assert shown(url) == expected
    assert "hunter2" not in shown(url) and "a b c" not in shown(url)


def test_none_stays_none():
    assert shown(None) is None
