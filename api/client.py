"""A small client for the HTTP read path, for bots that do not run chatmem in-process.

client = ChatmemClient("http://127.0.0.1:8765", api_key)
bundle = client.context(thread_id="tg:42", user_id="tg:7", query=text)
reply = openai.chat.completions.create(model=..., messages=bundle.messages)
"""

from __future__ import annotations

from typing import Any

import httpx

from chatmem.schemas.read import Budgets, ContextBundle, RecallResult, Scope


class ChatmemError(Exception):
    def __init__(self, status: int, error: str, detail: str):
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail


class ChatmemClient:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 10.0, transport: Any = None):
        self._http = httpx.Client(
            base_url=base_url, headers={"X-API-Key": api_key}, timeout=timeout, transport=transport
        )

    def context(
        self,
        *,
        thread_id: str,
        user_id: str,
        query: str | None = None,
        max_tokens: int | None = None,
        budgets: Budgets | None = None,
        system: str | None = None,
    ) -> ContextBundle:
        body: dict[str, Any] = {"thread_id": thread_id, "user_id": user_id, "query": query}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if budgets is not None:
            body["budgets"] = budgets.model_dump()
        if system is not None:
            body["system"] = system
        return ContextBundle.model_validate(self._call("POST", "/v1/context", json=body))

    def recall(
        self, *, user_id: str, query: str, scope: Scope | str = Scope.ALL, limit: int = 10, thread_id: str | None = None
    ) -> RecallResult:
        body = {"user_id": user_id, "query": query, "scope": str(Scope(scope)), "limit": limit, "thread_id": thread_id}
        return RecallResult.model_validate(self._call("POST", "/v1/recall", json=body))

    def episodes(self, thread_id: str, *, user_id: str) -> list[dict]:
        return self._call("GET", f"/v1/threads/{_quote(thread_id)}/episodes", params={"user_id": user_id})

    def episode(self, episode_id: str, *, user_id: str) -> dict:
        return self._call("GET", f"/v1/episodes/{_quote(episode_id)}", params={"user_id": user_id})

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        response = self._http.request(method, path, **kw)
        if response.status_code >= 400:
            try:
                body = response.json()
                raise ChatmemError(response.status_code, body.get("error", "error"), body.get("detail", ""))
            except ValueError:
                raise ChatmemError(response.status_code, "error", response.text[:200]) from None
        return response.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatmemClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")
