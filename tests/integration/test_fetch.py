"""Fetching attachment bytes over real sockets: a local HTTPS server with its own CA (trustme),
size and time limits, redirects, refusals of private addresses, connections pinned to the
checked address (DNS rebinding), file:// and data: URLs."""

import ipaddress
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chatmem.adapters.fetch import FetchLimits, UrlFetcher
from chatmem.memory.attachments import BadFile
from chatmem.memory.ports import TransientError
from chatmem.schemas.events import Attachment

pytestmark = pytest.mark.integration
BODY = b"\x89PNG\r\n\x1a\n" + b"x" * 5000
NAME = "files.chatmem.test"  # a name only the tests' resolver stubs know
SEEN: dict[str, list[str]] = {"host": [], "sni": []}  # what the server was sent


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        SEEN["host"].append(self.headers.get("Host", ""))
        if self.path == "/to-name":  # an absolute redirect to the host name the request came for
            self.send_response(302)
            self.send_header("Location", f"https://{self.headers['Host']}/ok.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
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
    cert = ca.issue_cert("127.0.0.1", "localhost", NAME)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    ctx.sni_callback = lambda sock, name, context: SEEN["sni"].append(name or "")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    yield f"https://127.0.0.1:{httpd.server_address[1]}", ca_file
    httpd.shutdown()


def fetcher(ca_file, resolve=socket.getaddrinfo, **kw):
    limits = {"max_bytes": 10_000, "timeout_s": 5.0, "allow_private": True, "ca_file": ca_file} | kw
    return UrlFetcher(FetchLimits(**limits), resolve=resolve)


def answer(*ips: str):
    """A getaddrinfo stub that answers `ips` for every name (and an IP literal with itself)."""
    asked: list[str] = []

    def resolve(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 - getaddrinfo's own names
        try:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (str(ipaddress.ip_address(host)), port))]
        except ValueError:
            asked.append(host)
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ips]

    resolve.asked = asked
    return resolve


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


def test_a_file_url_names_the_files_bytes_as_path_as_uri_wrote_them(tmp_path):
    # A name that is not UTF-8 (a machine set to ISO-8859-1 names "é" as the byte E9): as_uri
    # percent-encodes its bytes, and the URL must lead back to them, not to U+FFFD.
    latin1 = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.txt"))
    latin1.write_bytes(b"latin-1 name")
    (tmp_path / "café 2.txt").write_bytes(b"utf-8 name")
    f = UrlFetcher(FetchLimits(100, 1.0, file_root=tmp_path))
    assert latin1.as_uri().endswith("/caf%E9.txt") and f.fetch(latin1.as_uri()) == b"latin-1 name"
    assert f.fetch((tmp_path / "café 2.txt").as_uri()) == b"utf-8 name"
    assert f.fetch(tmp_path.as_uri() + "/caf%C3%A9%202.txt") == b"utf-8 name"  # as a bot would write it


def test_a_url_or_file_path_that_can_never_be_read_fails_the_file_with_its_reason(tmp_path):
    """Not an exception the attachment job does not know, which would leave the file pending and
    fail its task at every sweep. The wire accepts each of these URLs."""
    f = UrlFetcher(FetchLimits(100, 1.0))
    (tmp_path / "a.txt").write_bytes(b"hello")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for url, reason in [
        (tmp_path.as_uri() + "/a%00b", "NUL character"),
        (tmp_path.as_uri() + "/" + "a" * 300, "File name too long"),
        ((tmp_path / "a.txt").as_uri() + "/x", "Not a directory"),
        ((tmp_path / "loop1").as_uri(), "symbolic link"),
    ]:
        with pytest.raises(BadFile, match=reason):
            f.fetch(url)
    for url, reason in [
        ("https://[::1", "malformed URL"),
        ("https://a..b/", "malformed host name"),
        ("https://" + "a" * 64 + ".example/", "malformed host name"),  # a label over 63 characters
        ("https://:443/x", "names no host"),
        ("file://localhost", "names no file"),
        ("file:///", "names no file"),
    ]:
        with pytest.raises(BadFile, match=reason):
            f.fetch(url)
    # A device never ends and a FIFO waits for a writer: refused without reading or waiting.
    os.mkfifo(tmp_path / "fifo")
    for url in ("file:///dev/zero", (tmp_path / "fifo").as_uri()):
        with pytest.raises(BadFile, match="not a regular file"):
            f.fetch(url)
    with pytest.raises(BadFile, match="larger than the limit"):
        f.fetch("file:///proc/self/status")  # a size of 0, and more than 100 bytes to read
    # chatmem's own files are never an attachment, whatever the producer names.
    own = tmp_path / "data"
    (own / "keys").mkdir(parents=True)
    (own / "keys" / "kek").write_text("c2VjcmV0")
    (tmp_path / ".env").write_text("CHATMEM_TELEGRAM_BOT_TOKEN=123:abc")
    guarded = UrlFetcher(FetchLimits(100, 1.0, refused=(own, tmp_path / ".env")))
    for url in ((own / "keys" / "kek").as_uri(), (tmp_path / ".env").as_uri(), (own / ".." / "data").as_uri()):
        with pytest.raises(BadFile, match="chatmem's own"):
            guarded.fetch(url)
    assert guarded.fetch((tmp_path / "a.txt").as_uri()) == b"hello"
    with pytest.raises(BadFile) as long_name:
        f.fetch(tmp_path.as_uri() + "/" + "b" * 5000)
    assert len(long_name.value.reason) < 300  # the reason is stored: not the whole name


_URL_PIECES = st.text(max_size=12) | st.sampled_from(
    ["[", "]", "%00", "%2e%2e", "..", ":", "@", "a" * 70, "/", "%", "#", "?", "dev/zero", "proc/self/status", "\\"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(["https://", "file://", "file:///", "data:", "data:;base64,", "telegram:file/"]),
    st.lists(_URL_PIECES, max_size=5),
)
def test_any_url_the_wire_accepts_is_fetched_or_fails_as_the_job_knows(tmp_path_factory, scheme, pieces):
    """The attachment job knows BadFile (the file fails) and TransientError (retried): nothing
    else may come out of a fetch. Offline: names do not resolve; files only under an empty folder."""
    url = scheme + "".join(pieces)
    try:
        Attachment(url=url)
    except ValidationError:
        return  # the wire refuses it: it never reaches a worker

    def offline(host, port, *args, **kwargs):
        host.encode("idna")  # what getaddrinfo does with the name first
        raise socket.gaierror(socket.EAI_NONAME, "offline")

    inbox = tmp_path_factory.mktemp("inbox")
    f = UrlFetcher(FetchLimits(1_000, 1.0, file_root=inbox), resolve=offline)
    try:
        assert len(f.fetch(url)) <= 1_000
    except (BadFile, TransientError):
        pass


def test_a_pinned_connection_verifies_the_certificate_and_sends_the_host_name(server):
    base, ca = server
    port = base.rsplit(":", 1)[1]
    SEEN["host"].clear()
    SEEN["sni"].clear()
    # The name maps to the local server (private addresses allowed here): the request goes to
    # 127.0.0.1 while TLS checks the certificate against the name and the Host header carries it.
    dns = answer("127.0.0.1")
    assert fetcher(ca, dns).fetch(f"https://{NAME}:{port}/ok.png") == BODY
    assert SEEN["host"] == [f"{NAME}:{port}"] and SEEN["sni"] == [NAME]
    assert dns.asked == [NAME]
    # Each hop of a redirect is resolved, checked and pinned the same way.
    assert fetcher(ca, dns).fetch(f"https://{NAME}:{port}/to-name") == BODY
    assert dns.asked == [NAME, NAME, NAME]
    # A name the certificate does not carry fails although the IP is the same: verification is
    # against the name, not skipped because the connection was made to an address.
    with pytest.raises(BadFile, match="untrusted TLS certificate"):
        fetcher(ca, answer("127.0.0.1")).fetch(f"https://other.chatmem.test:{port}/ok.png")
    # An address that refuses the connection is passed over for the next checked one.
    assert fetcher(ca, answer("127.0.0.2", "127.0.0.1")).fetch(f"https://{NAME}:{port}/ok.png") == BODY


def test_dns_rebinding_cannot_reach_a_private_address(server, monkeypatch):
    """The name answers a public address for the check, then 127.0.0.1 (where a server listens)
    to anyone who asks again. The system resolver is the same stub here, so a client that
    resolved the name a second time to connect would reach the local server."""
    base, ca = server
    port = int(base.rsplit(":", 1)[1])
    public = "93.184.215.14"
    asked: list[str] = []

    def rebinding(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        try:
            ip = str(ipaddress.ip_address(host))
        except ValueError:
            asked.append(host)
            ip = public if len(asked) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    connected: list[tuple[str, int]] = []
    real_connect = socket.create_connection

    def connect(address, *args, **kwargs):
        connected.append(address)
        ip = rebinding(*address)[0][4][0]
        if ip == public:  # no internet here: the public server refuses
            raise ConnectionRefusedError(111, "Connection refused")
        return real_connect((ip, address[1]), *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(socket, "create_connection", connect)
    SEEN["host"].clear()
    with pytest.raises(TransientError, match="cannot reach"):
        fetcher(ca, rebinding, allow_private=False).fetch(f"https://{NAME}:{port}/ok.png")
    assert connected == [(public, port)]  # the checked address, and never the second answer
    assert asked == [NAME]
    assert SEEN["host"] == []  # the local server saw no request


def test_addresses_that_stand_for_private_ones_are_refused():
    for ip in ("::ffff:127.0.0.1", "64:ff9b::a00:5", "100.64.0.1", "169.254.169.254", "::1", "0.0.0.0"):
        with pytest.raises(BadFile, match="private address"):
            UrlFetcher(FetchLimits(10_000, 5.0), resolve=answer(ip)).fetch("https://intranet.example.com/a.png")
    # One private address among public ones is enough to refuse the name.
    with pytest.raises(BadFile, match=r"private address \(10.0.0.5\)"):
        UrlFetcher(FetchLimits(10_000, 5.0), resolve=answer("93.184.215.14", "10.0.0.5")).fetch("https://x.example/a")
