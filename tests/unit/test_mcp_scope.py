"""Who an MCP call is for: the key (or the stdio user) decides; a `user_id` argument may only pick
one of the key's users, never another."""

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from chatmem.adapters.api_keys import KeyInfo
from chatmem.api.mcp_server import MemoryTools, _summary_parts, api_key_from, default_thread


@pytest.fixture
def tools():
    return MemoryTools(container=None, publisher=lambda: None)  # type: ignore[arg-type]


def test_a_one_user_key_needs_no_user_and_allows_only_its_own(tools):
    key = KeyInfo("a", ("alice",))
    assert tools.user(key, None) == "alice"
    assert tools.user(key, "alice") == "alice"
    with pytest.raises(ToolError, match="may not read user 'bob'"):
        tools.user(key, "bob")


def test_a_user_id_is_never_a_pattern(tools):
    for sneaky in ("*", "%", "alice%", "alice,bob", ""):
        with pytest.raises(ToolError):
            tools.user(KeyInfo("a", ("alice",)), sneaky)


def test_several_users_or_every_user_must_be_named(tools):
    multi = KeyInfo("m", ("alice", "carol"))
    with pytest.raises(ToolError, match="one of alice, carol"):
        tools.user(multi, None)
    assert tools.user(multi, "carol") == "carol"
    with pytest.raises(ToolError):
        tools.user(multi, "bob")
    admin = KeyInfo("all", ("*",))
    with pytest.raises(ToolError, match="every user: pass user_id"):
        tools.user(admin, None)
    assert tools.user(admin, "bob") == "bob"


def test_writes_default_to_the_users_own_thread(tools):
    assert tools.writable_thread("alice", None) == default_thread("alice") == "mcp:alice"
    assert tools.writable_thread("alice", "mcp:alice") == "mcp:alice"


def test_the_api_key_comes_from_x_api_key_or_a_bearer_token():
    assert api_key_from({"x-api-key": "cm_1"}) == "cm_1"
    assert api_key_from({"authorization": "Bearer cm_2"}) == "cm_2"
    assert api_key_from({"authorization": "Basic abc"}) is None
    assert api_key_from({}) is None and api_key_from(None) is None


def test_an_episode_summary_is_the_final_one_else_the_latest_running_one():
    running = [
        {"kind": "running", "upto_seq": 3, "text": "old", "content": {"open_loops": ["a"]}},
        {"kind": "running", "upto_seq": 6, "text": "new", "content": {"open_loops": ["b"]}},
    ]
    assert _summary_parts(running) == ("new", ["b"], [])
    final = {"kind": "final", "upto_seq": 8, "text": "done", "content": {"open_questions": ["q"], "todos": ["t"]}}
    assert _summary_parts([*running, final]) == ("done", ["q", "t"], [])
    assert _summary_parts([]) == (None, [], [])


def test_what_an_event_refuses_is_the_tools_error_for_every_write(tools):
    # NUL cannot reach Postgres through a command's text; the tool says so instead of failing.
    alice = KeyInfo("a", ("alice",))
    with pytest.raises(ToolError, match="args: /text contains a NUL character"):
        tools.add_memory(alice, "I like\x00 tea", "remember", None, None)
    with pytest.raises(ToolError, match="args: /text contains a NUL character"):
        tools.forget(alice, "tea\x00", None, None)
    with pytest.raises(ToolError, match="text: must not contain NUL"):
        tools.add_memory(alice, "hi\x00", "message", None, None)
