"""The HTTP read path (FastAPI). Every route names the user it reads for; the API key must
cover that user, and the thread or episode must be one the user wrote in. Errors are JSON:
{"error": <code>, "detail": <what to fix>}. OpenAPI docs at /docs, the schema at /openapi.json."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from chatmem import status
from chatmem.adapters import metrics
from chatmem.adapters.api_keys import ALL_USERS, KeyInfo
from chatmem.bootstrap import Container
from chatmem.memory.recall import NotReadable
from chatmem.schemas.events import InvalidEvent, validate_identifier
from chatmem.schemas.read import Budgets, ContextBundle, RecallResult, Scope

API_KEY_HEADER = "X-API-Key"


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def _identifier(value: str, field: str) -> str:
    try:
        return validate_identifier(value, field)
    except InvalidEvent as error:
        raise ValueError(error.reason) from None


class ContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    thread_id: str
    user_id: str
    query: str | None = Field(None, max_length=4000, description="the user's new message, to retrieve for")
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    budgets: Budgets | None = None
    system: str | None = Field(None, max_length=100_000, description="the bot's persona / system text")

    @field_validator("thread_id", "user_id")
    @classmethod
    def _check_ids(cls, v: str, info: Any) -> str:
        return _identifier(v, info.field_name)


class RecallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str
    query: str = Field(min_length=1, max_length=4000)
    scope: Scope = Scope.ALL
    limit: int = Field(10, ge=1, le=100)
    thread_id: str | None = Field(None, description="only this thread; unset: every thread the user wrote in")

    @field_validator("user_id", "thread_id")
    @classmethod
    def _check_ids(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else _identifier(v, info.field_name)


class Episode(BaseModel):
    episode_id: str
    ordinal: int
    status: str
    start_seq: int
    end_seq: int | None
    opened_by: str
    closed_by: str | None
    started_at: Any
    ended_at: Any
    topic_label: str | None
    messages: int


def caller(request: Request, x_api_key: Annotated[str | None, Header(alias=API_KEY_HEADER)] = None) -> KeyInfo:
    if not x_api_key:
        raise ApiError(401, "missing_api_key", f"send your API key in the {API_KEY_HEADER} header")
    key = request.app.state.container.api_keys.verify(x_api_key)
    if key is None:
        raise ApiError(401, "invalid_api_key", "this API key is unknown or revoked")
    return key


Caller = Annotated[KeyInfo, Depends(caller)]


def create_app(container: Container) -> FastAPI:
    app = FastAPI(
        title="chatmem",
        version="1",
        summary="Conversation memory for chat bots: token-budgeted context and recall with citations.",
    )
    app.state.container = container
    shared_state = metrics.SharedStateCollector(lambda: status.shared_state(container))
    m = metrics.instruments()

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=422)

    def allowed(key: KeyInfo, user_id: str) -> None:
        if not key.allows(user_id):
            raise ApiError(403, "forbidden_user", f"this API key may not read user {user_id!r}")

    def not_found(what: str) -> ApiError:
        # The same answer whether it does not exist or belongs to someone else.
        return ApiError(404, "not_found", f"{what} not found for this user")

    @app.post("/v1/context", response_model=ContextBundle, tags=["read"])
    def context(body: ContextRequest, key: Caller) -> ContextBundle:
        """Token-budgeted context for the bot's next reply, as sections and as chat messages."""
        allowed(key, body.user_id)
        kw: dict[str, Any] = {"max_tokens": body.max_tokens, "system": body.system}
        if body.budgets is not None:
            kw["budgets"] = body.budgets
        try:
            with metrics.timed(m.context_seconds):
                return container.build_context(body.thread_id, body.user_id, body.query, **kw)
        except NotReadable:
            raise not_found(f"thread {body.thread_id!r}") from None

    @app.post("/v1/recall", response_model=RecallResult, tags=["read"])
    def recall(body: RecallRequest, key: Caller) -> RecallResult:
        """Hybrid search over the user's messages, summaries and facts, with citations."""
        allowed(key, body.user_id)
        try:
            with metrics.timed(m.recall_seconds):
                return container.recall(
                    body.user_id, body.query, scope=body.scope, limit=body.limit, thread_id=body.thread_id
                )
        except NotReadable:
            raise not_found(f"thread {body.thread_id!r}") from None

    @app.get("/v1/threads/{thread_id}/episodes", response_model=list[Episode], tags=["browse"])
    def episodes(
        key: Caller,
        thread_id: Annotated[str, Path(max_length=128)],
        user_id: Annotated[str, Query(description="the user reading")],
    ) -> list[dict]:
        user_id = _path_id(user_id, "user_id")
        allowed(key, user_id)
        thread_id = _path_id(thread_id)
        if not container.browser.readable_threads(user_id, thread_id):
            raise not_found(f"thread {thread_id!r}")
        return container.browser.episodes(thread_id)

    @app.get("/v1/episodes/{episode_id}", tags=["browse"])
    def episode(
        key: Caller,
        episode_id: Annotated[str, Path(max_length=200)],
        user_id: Annotated[str, Query(description="the user reading")],
    ) -> dict:
        """One episode with its summaries and messages."""
        user_id = _path_id(user_id, "user_id")
        allowed(key, user_id)
        ep = container.browser.episode(_path_id(episode_id, "episode_id"))
        if ep is None or not container.browser.readable_threads(user_id, ep["thread_id"]):
            raise not_found(f"episode {episode_id!r}")
        return ep

    @app.delete("/v1/users/{user_id}", tags=["privacy"])
    def erase_user(key: Caller, user_id: Annotated[str, Path(max_length=200)]) -> dict:
        """Erase a user for good (right to erasure), as `chatmem erase --user` does. Admin keys
        only (keys for every user, `*`): a key bound to users may not erase them. Returns what
        was removed, per store."""
        if ALL_USERS not in key.user_ids:
            raise ApiError(403, "admin_only", "erasing a user needs an admin API key (one for every user)")
        user_id = _path_id(user_id, "user_id")
        return {"erased": user_id, "removed": container.erase(user_id=user_id, requested_by=f"api:{key.name}")}

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    def metrics_text() -> Response:
        """Prometheus metrics: the pipeline's shared state (events, dead letters, stream, queues,
        lag), read now, and what every process recorded (docs/operations.md, "Metrics")."""
        return Response(metrics.exposition(shared_state), media_type=metrics.CONTENT_TYPE)

    @app.get("/readyz", tags=["ops"])
    def readyz() -> JSONResponse:
        checks: dict[str, str] = {}
        try:
            with container.pool.connection() as conn:
                conn.execute("SELECT 1 FROM api_keys LIMIT 1")
            checks["postgres"] = "ok"
        except Exception as error:  # noqa: BLE001 - reported, not raised: this is the health answer
            checks["postgres"] = f"down: {type(error).__name__}"
        try:
            container.redis.ping()
            checks["redis"] = "ok"
        except Exception as error:  # noqa: BLE001
            checks["redis"] = f"down: {type(error).__name__}"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ready" if ready else "not_ready", **checks}, status_code=200 if ready else 503)

    return app


def _path_id(value: str, field: str = "thread_id") -> str:
    """A client id from a path or query string, checked; an ApiError (422) names the field."""
    try:
        if field == "episode_id":
            # <thread_id>#<ordinal>; clients send the '#' as %23.
            thread, _, ordinal = value.rpartition("#")
            if not ordinal.isdigit():
                raise InvalidEvent(f"{field}: expected <thread_id>#<number>")
            validate_identifier(thread, field)
            return value
        return validate_identifier(value, field)
    except InvalidEvent as error:
        raise ApiError(422, "invalid_request", error.reason) from None
