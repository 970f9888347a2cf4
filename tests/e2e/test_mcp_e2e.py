"""`chatmem mcp` used through the MCP SDK's own client, over stdio and over streamable HTTP, against
a real stack (ingest and a worker as processes): the tools are listed, a memory is added, and once
processed `search_memory` finds it with its citation. A key for one user reaches nothing of
another user's through any tool argument or resource URI."""

import socket
import sys
import time

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import ROOT, scalar, settings_env, spawn, stop, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TOOLS = {
    "search_memory",
    "get_context",
    "add_memory",
    "delete_message",
    "list_episodes",
    "get_episode",
    "forget",
    "what_do_you_know",
}
WEDDING = "My sister's wedding is in Porto on the 14th of June, and I am bringing the cake."


@pytest.fixture
def stack(container):
    s = container.settings
    queues = "segment,summarize,facts,maintenance"
    procs = [spawn(s, "ingest"), spawn(s, "worker", "--queues", queues, "--concurrency", "1")]
    yield container
    for p in procs:
        stop(p)


def call(session, name, **arguments):
    return session.call_tool(name, arguments)


async def until_found(session, event_id: str, query: str, timeout: float = 240) -> dict:
    """Polls search_memory, as a client would, until the added message is processed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await call(session, "search_memory", query=query, scope="messages", limit=5)
        assert not result.is_error, result.content
        hits = [h for h in result.structured_content["hits"] if h["citation"]["event_id"] == event_id]
        if hits:
            return hits[0]
        await anyio.sleep(1)
    raise AssertionError(f"event {event_id} was not searchable after {timeout}s")


async def add_and_find(session, user: str) -> dict:
    assert {t.name for t in (await session.list_tools()).tools} == TOOLS
    added = await call(session, "add_memory", text=WEDDING)
    assert not added.is_error, added.content
    queued = added.structured_content
    assert queued["status"] == "queued" and queued["thread_id"] == f"mcp:{user}"
    hit = await until_found(session, queued["event_id"], "sister wedding Porto")
    assert "Porto" in hit["snippet"] and hit["author"] == user
    citation = hit["citation"]
    assert citation["thread_id"] == f"mcp:{user}" and citation["episode_id"] == f"mcp:{user}#1"
    assert citation["seq"] == 1 and citation["occurred_at"]
    return hit


def test_stdio_client_adds_a_memory_and_finds_it_with_its_citation(stack, tmp_path):
    env = settings_env(stack.settings) | {"HF_HUB_OFFLINE": "1", "MEM0_TELEMETRY": "False"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "chatmem.api.cli", "mcp", "--user", "alice"], env=env, cwd=ROOT
    )

    async def main() -> None:
        with open(tmp_path / "mcp-stderr.log", "w", encoding="utf-8") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await add_and_find(session, "alice")
                episodes = (await call(session, "list_episodes")).structured_content["episodes"]
                assert [e["episode_id"] for e in episodes] == ["mcp:alice#1"]
                assert episodes[0]["uri"] == "chatmem://threads/mcp:alice/episodes/1"
                resource = await session.read_resource(episodes[0]["uri"])
                assert "Porto" in resource.contents[0].text
                bundle = (await call(session, "get_context", query="wedding")).structured_content
                assert bundle["thread_id"] == "mcp:alice" and "Porto" in str(bundle["sections"])
                remembered = await call(session, "add_memory", text="I am vegetarian", kind="remember")
                assert not remembered.is_error, remembered.content

                async def known() -> list:
                    return (await call(session, "what_do_you_know")).structured_content["facts"]

                deadline = time.monotonic() + 120
                while not await known() and time.monotonic() < deadline:
                    await anyio.sleep(1)
                assert any("vegetarian" in f["value"] for f in await known())

                # The user asks to delete what they stored: the message goes, with what it became.
                slip = await call(session, "add_memory", text="My bank PIN is 4471, keep it safe.")
                slip_id = slip.structured_content["event_id"]
                await until_found(session, slip_id, "bank PIN")
                deleted = await call(session, "delete_message", event_id=slip_id)
                assert not deleted.is_error, deleted.content
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and "4471" in str(
                    (await call(session, "search_memory", query="bank PIN", limit=10)).structured_content
                ):
                    await anyio.sleep(1)
                assert "4471" not in str((await call(session, "get_context", query="bank PIN")).structured_content)
                again = await call(session, "delete_message", event_id=slip_id)
                assert again.is_error and "no message" in again.content[0].text

    anyio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_client_is_scoped_to_its_key_and_never_reaches_another_user(stack):
    c = stack
    Publisher(c.sink, c.settings.resolved_spool_dir).publish_many(
        [MessageEvent(event_id="b1", thread_id="bob-chat", user_id="bob", text="My locker code is 9917.")]
    )
    keys = {"alice": c.api_keys.create("alice-mcp", ["alice"]), "bob": c.api_keys.create("bob-mcp", ["bob"])}
    port = _free_port()
    server = spawn(c.settings, "mcp", "--transport", "http", "--port", str(port))
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        assert wait_for(lambda: _answers(url), timeout=60), stop(server)[-3000:]
        r = httpx.post(url, json={})
        assert r.status_code == 401 and r.json()["error"] == "missing_api_key"
        assert httpx.post(url, json={}, headers={"X-API-Key": "cm_nope"}).json()["error"] == "invalid_api_key"
        processed = lambda: scalar(c, "SELECT count(*) FROM messages WHERE thread_id = 'bob-chat'") == 1  # noqa: E731
        assert wait_for(processed, timeout=120)
        anyio.run(_alice_and_bob, url, keys)
    finally:
        log = stop(server)
    assert "Traceback" not in log, log[-3000:]


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, json={}, timeout=2).status_code == 401
    except httpx.HTTPError:
        return False


async def _session(url: str, key: str, run) -> None:
    async with (
        httpx2.AsyncClient(headers={"X-API-Key": key}, timeout=httpx2.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await run(session)


async def _alice_and_bob(url: str, keys: dict[str, str]) -> None:
    async def as_bob(session) -> None:
        # Bob's own key reads his episode: it exists, so alice's refusals below are scoping.
        ep = await call(session, "get_episode", episode_id="bob-chat#1")
        assert not ep.is_error and "9917" in ep.structured_content["messages"][0]["text"]

    async def as_alice(session) -> None:
        await add_and_find(session, "alice")
        refused = {
            "search_memory": [{"query": "locker code", "user_id": "bob"}, {"query": "locker", "thread_id": "bob-chat"}],
            "get_context": [{"thread_id": "bob-chat"}, {"user_id": "bob"}, {"user_id": "*"}],
            "list_episodes": [{"thread_id": "bob-chat"}, {"user_id": "bob"}],
            "get_episode": [{"episode_id": "bob-chat#1"}, {"episode_id": "bob-chat#1", "user_id": "bob"}],
            "add_memory": [{"text": "hi", "thread_id": "bob-chat"}, {"text": "hi", "user_id": "bob"}],
            "forget": [{"text": "locker", "user_id": "bob"}, {"text": "locker", "thread_id": "bob-chat"}],
            "delete_message": [{"event_id": "b1"}, {"event_id": "b1", "user_id": "bob"}],
            "what_do_you_know": [{"user_id": "bob"}, {"user_id": "%"}],
        }
        for tool, calls in refused.items():
            for arguments in calls:
                result = await session.call_tool(tool, arguments)
                assert result.is_error, (tool, arguments, result.structured_content)
                assert "9917" not in str(result.content)
        # Bob's thread and episode look exactly like ones that do not exist.
        missing = await call(session, "get_episode", episode_id="nobody#1")
        mine = await call(session, "get_episode", episode_id="bob-chat#1")
        assert mine.content[0].text.replace("bob-chat", "nobody") == missing.content[0].text
        hits = (await call(session, "search_memory", query="locker code 9917")).structured_content["hits"]
        assert all(h["citation"]["thread_id"] == "mcp:alice" for h in hits)
        episodes = (await call(session, "list_episodes")).structured_content["episodes"]
        assert {e["thread_id"] for e in episodes} == {"mcp:alice"}
        assert (await call(session, "what_do_you_know")).structured_content["user_id"] == "alice"
        for uri in (
            "chatmem://threads/bob-chat/episodes/1",
            "chatmem://threads/bob-chat/summaries",
            "chatmem://episodes?user_id=bob",
        ):
            with pytest.raises(MCPError):
                await session.read_resource(uri)

    await _session(url, keys["bob"], as_bob)
    await _session(url, keys["alice"], as_alice)
