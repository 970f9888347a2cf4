"""Fetching attachment bytes over real sockets: a local HTTPS server with its own CA (trustme),
size and time limits, redirects, refusals of private addresses, file:// and data: URLs."""

import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from chatmem.adapters.fetch import FetchLimits, UrlFetcher
from chatmem.memory.attachments import BadFile
from chatmem.memory.ports import TransientError

pytestmark = pytest.mark.integration
BODY = b"\x89PNG\r\n\x1a\n" + b"x" * 5000


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        routes = {
            "/ok.png": (200, {"Content-Type": "image/png"}, BODY),
            "/missing": (404, {}, b"no"),
            "/busy": (503, {}, b"later"),
            "/hop": (302, {"Location": "/ok.png"}, b""),
            "/plain-http": (302, {"Location": "http://example.com/x"}, b""),
        }
        if self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(20):
                self.wfile.write(b"y" * 10)
                self.wfile.flush()
                time.sleep(0.1)
            return
        if self.path == "/unsized":  # no Content-Length: the cap applies while reading
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"z" * 20_000)
            return
        status, headers, body = routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    yield f"https://127.0.0.1:{httpd.server_address[1]}", ca_file
    httpd.shutdown()


def fetcher(ca_file, **kw):
    limits = {"max_bytes": 10_000, "timeout_s": 5.0, "allow_private": True, "ca_file": ca_file} | kw
    return UrlFetcher(FetchLimits(**limits))


def test_https_download_follows_checked_redirects(server):
    base, ca = server
    assert fetcher(ca).fetch(f"{base}/ok.png") == BODY
    assert fetcher(ca).fetch(f"{base}/hop") == BODY
    with pytest.raises(BadFile, match="redirected to a URL that is not fetched"):
        fetcher(ca).fetch(f"{base}/plain-http")


def test_private_and_loopback_addresses_are_refused_unless_allowed(server):
    base, ca = server
    with pytest.raises(BadFile, match=r"resolves to a private address \(127.0.0.1\)"):
        fetcher(ca, allow_private=False).fetch(f"{base}/ok.png")

    def resolve_to_private(host, port, type):  # noqa: A002 - getaddrinfo's own name
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]

    fetch = UrlFetcher(FetchLimits(10_000, 5.0), resolve=resolve_to_private)
    with pytest.raises(BadFile, match="10.1.2.3"):
        fetch.fetch("https://intranet.example.com/a.png")


def test_limits_and_server_errors(server):
    base, ca = server
    with pytest.raises(BadFile, match="above the limit"):
        fetcher(ca, max_bytes=100).fetch(f"{base}/ok.png")
    with pytest.raises(BadFile, match="larger than the limit"):
        fetcher(ca).fetch(f"{base}/unsized")
    with pytest.raises(TransientError, match="longer than 0.5 s"):
        fetcher(ca, timeout_s=0.5).fetch(f"{base}/slow")
    with pytest.raises(TransientError, match="503"):
        fetcher(ca).fetch(f"{base}/busy")
    with pytest.raises(BadFile, match="404"):
        fetcher(ca).fetch(f"{base}/missing")
    with pytest.raises(TransientError, match="cannot reach"):
        fetcher(ca).fetch("https://127.0.0.1:9/closed")  # nothing listens on the discard port
    with pytest.raises(BadFile, match="untrusted TLS certificate"):  # waiting would not fix it
        fetcher(None).fetch(f"{base}/ok.png")


def test_file_and_data_urls(tmp_path):
    f = UrlFetcher(FetchLimits(100, 1.0, file_root=tmp_path / "inbox"))
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "a.txt").write_bytes(b"hello")
    (tmp_path / "secret.txt").write_bytes(b"no")
    assert f.fetch((tmp_path / "inbox" / "a.txt").as_uri()) == b"hello"
    with pytest.raises(BadFile, match="outside the allowed folder"):
        f.fetch((tmp_path / "inbox" / ".." / "secret.txt").as_uri())
    assert f.fetch("data:text/plain;base64,aGVsbG8=") == b"hello"
    assert f.fetch("data:,hello%20there") == b"hello there"
    with pytest.raises(BadFile, match="malformed data: URI"):
        f.fetch("data:text/plain;base64,@@@")
    with pytest.raises(BadFile, match="above the limit"):
        f.fetch("data:," + "x" * 200)
    with pytest.raises(BadFile, match="scheme 'ftp'"):
        f.fetch("ftp://example.com/a")
