"""The HTTP read path served for real (uvicorn on a local port) and used through the Python
client: keys scoped to users, clear JSON errors, isolation, the OpenAPI document."""

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from chatmem.api.client import ChatmemClient, ChatmemError
from chatmem.api.http import create_app
from tests.integration.test_read_path import memory  # noqa: F401 - the shared fixture

pytestmark = pytest.mark.integration


@pytest.fixture
def server(memory):  # noqa: F811
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(memory), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    keys = {
        "alice": memory.api_keys.create("alice-bot", ["alice"]),
        "bob": memory.api_keys.create("bob-bot", ["bob"]),
        "all": memory.api_keys.create("platform", ["*"]),
    }
    yield f"http://127.0.0.1:{port}", keys, memory
    srv.should_exit = True
    thread.join(10)


def test_a_bot_gets_context_and_recall_through_the_client(server):
    url, keys, _ = server
    with ChatmemClient(url, keys["alice"]) as client:
        bundle = client.context(thread_id="garden", user_id="alice", query="what was my locker code?")
        assert bundle.tokens <= 8000 and bundle.messages[0]["role"] == "system"
        assert bundle.messages[-1]["content"].startswith("What about the new shed colour")
        hits = client.recall(user_id="alice", query="locker code", limit=3).hits
        assert "4512" in hits[0].snippet and hits[0].citation.platform_message_id == "garden-m2"
        episodes = client.episodes("garden", user_id="alice")
        assert [e["status"] for e in episodes] == ["closed", "open"]
        one = client.episode(episodes[0]["episode_id"], user_id="alice")
        assert one["summaries"] and len(one["messages"]) == 6


def test_missing_or_wrong_key_is_401_with_a_clear_body(server):
    url, _, _ = server
    r = httpx.post(f"{url}/v1/recall", json={"user_id": "alice", "query": "x"})
    assert r.status_code == 401 and r.json() == {
        "error": "missing_api_key",
        "detail": "send your API key in the X-API-Key header",
    }
    r = httpx.post(f"{url}/v1/recall", json={"user_id": "alice", "query": "x"}, headers={"X-API-Key": "cm_nope"})
    assert r.status_code == 401 and r.json()["error"] == "invalid_api_key"


def test_a_key_reads_only_its_users(server):
    url, keys, c = server
    with ChatmemClient(url, keys["bob"]) as bob:
        with pytest.raises(ChatmemError) as err:
            bob.recall(user_id="alice", query="locker code")
        assert err.value.status == 403 and err.value.error == "forbidden_user"
        with pytest.raises(ChatmemError) as err:
            bob.context(thread_id="garden", user_id="alice")
        assert err.value.status == 403
        # As himself, bob finds nothing of alice's, and her thread does not exist for him.
        assert all(h.citation.thread_id == "laptops" for h in bob.recall(user_id="bob", query="locker code 4512").hits)
        for call in (
            lambda: bob.context(thread_id="garden", user_id="bob"),
            lambda: bob.recall(user_id="bob", query="locker", thread_id="garden"),
            lambda: bob.episodes("garden", user_id="bob"),
            lambda: bob.episode("garden#1", user_id="bob"),
        ):
            with pytest.raises(ChatmemError) as err:
                call()
            assert err.value.status == 404
    c.api_keys.revoke("bob-bot")
    r = httpx.post(f"{url}/v1/recall", json={"user_id": "bob", "query": "x"}, headers={"X-API-Key": keys["bob"]})
    assert r.status_code == 401


def test_malicious_ids_are_refused_clearly(server):
    url, keys, _ = server
    h = {"X-API-Key": keys["all"]}
    for evil in ["*", "%", "alice' OR '1'='1", "a" * 300, "", "al ice"]:
        r = httpx.post(f"{url}/v1/recall", json={"user_id": evil, "query": "locker"}, headers=h)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request" and "user_id" in r.json()["detail"]
        r = httpx.post(f"{url}/v1/context", json={"user_id": "alice", "thread_id": evil}, headers=h)
        assert r.status_code == 422 and "thread_id" in r.json()["detail"]
        r = httpx.get(f"{url}/v1/threads/garden/episodes", params={"user_id": evil}, headers=h)
        assert r.status_code == 422


def test_a_wildcard_key_still_reads_only_the_named_user(server):
    url, keys, _ = server
    with ChatmemClient(url, keys["all"]) as platform:
        hits = platform.recall(user_id="bob", query="locker code 4512 garden").hits
        assert hits and all(h.citation.thread_id == "laptops" for h in hits)


def test_health_readiness_and_openapi(server):
    url, _, _ = server
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200 and ready.json()["postgres"] == "ok" and ready.json()["redis"] == "ok"
    spec = httpx.get(f"{url}/openapi.json").json()
    assert {"/v1/context", "/v1/recall", "/v1/threads/{thread_id}/episodes", "/v1/episodes/{episode_id}"} <= set(
        spec["paths"]
    )
    assert httpx.get(f"{url}/docs").status_code == 200
    bad = httpx.post(f"{url}/v1/recall", json={"user_id": "alice"}, headers={"X-API-Key": "x"})
    assert bad.status_code in (401, 422)


def test_only_an_admin_key_erases_a_user_and_reads_find_nothing_after(server):
    url, keys, c = server
    r = httpx.delete(f"{url}/v1/users/alice", headers={"X-API-Key": keys["alice"]})
    assert r.status_code == 403 and r.json()["error"] == "admin_only"  # a key for alice may not erase her
    assert c.recall("alice", "locker code").hits  # nothing was touched
    r = httpx.delete(f"{url}/v1/users/alice", headers={"X-API-Key": keys["all"]}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["erased"] == "alice" and body["removed"]["keys"] >= 1 and body["removed"]["threads"] == 1
    with ChatmemClient(url, keys["alice"]) as alice:
        assert alice.recall(user_id="alice", query="locker code").hits == []
    with ChatmemClient(url, keys["bob"]) as bob:
        assert bob.recall(user_id="bob", query="laptop").hits  # bob's memory is untouched


def test_an_emoji_or_a_nul_in_a_query_is_answered_not_a_server_error(server):
    url, keys, _ = server
    for query in ("👍", "locker\u0000code"):
        for path, body in (("/v1/recall", {}), ("/v1/context", {"thread_id": "garden"})):
            r = httpx.post(
                f"{url}{path}", json={"user_id": "alice", "query": query, **body}, headers={"X-API-Key": keys["alice"]}
            )
            assert r.status_code == 200, (path, query, r.text)
