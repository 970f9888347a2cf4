"""A local OpenAI-compatible chat and speech-to-text endpoint for adapter tests (no model is reachable from here):
answers every POST with a set status and body and records the requests it got."""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content: dict, model: str = "m") -> dict:
    """A chat completion whose message is `content` as JSON (a structured output)."""
    message = {"role": "assistant", "content": json.dumps(content)}
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }


class FakeOpenAI(BaseHTTPRequestHandler):
    status = 200
    body: dict = {}
    requests: list[dict] = []
    delay_s = 0.0  # a stalled endpoint: accepts the request, then says nothing for this long

    def do_POST(self):  # noqa: N802
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        kind = self.headers.get("Content-Type", "")
        # An upload (speech to text) comes as a form: kept whole, with where it went.
        type(self).requests.append(
            json.loads(raw) if kind.startswith("application/json") else {"path": self.path, "form": raw}
        )
        time.sleep(type(self).delay_s)
        self._send(type(self).status, json.dumps(type(self).body).encode())

    def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out on a stalled endpoint and hung up, as the test meant it to

    def log_message(self, *args):
        pass


@contextmanager
def serving() -> Iterator[str]:
    """The endpoint's base URL (…/v1), with a fresh request log."""
    FakeOpenAI.status, FakeOpenAI.body, FakeOpenAI.requests, FakeOpenAI.delay_s = 200, {}, [], 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
