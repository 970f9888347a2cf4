"""Fetching attachment bytes from file://, https://, data: and telegram:file/ URLs, within limits.

https:// downloads stream with a size cap and a time limit; every address a host name resolves
to is checked, and private, loopback, link-local and reserved ones are refused unless allowed
(the URL comes from chat content; the worker must not become a way into the private network).
The name is resolved once per hop and the connection goes to an address that passed the check
(the request is sent to the IP, with the host name as TLS SNI, for certificate verification,
and as the Host header), so a DNS answer that changes between the check and the connection (DNS
rebinding) cannot reach a private address. Redirects are followed by hand so each hop is
checked and pinned the same way.

`telegram:file/<file_id>` names a file a Telegram bot received. It is resolved through the Bot
API (`getFile`, then the file download) with the bot token from the settings; the API base is
trusted configuration, so the private-address check does not apply to it. The token is part of
every Bot API URL, so no URL is ever put in an error, and the `httpx` logger (which logs request
URLs at INFO) gets a filter that redacts bot tokens."""

from __future__ import annotations

import base64
import errno
import ipaddress
import logging
import os
import re
import socket
import ssl
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit

import httpx
from pydantic import SecretStr

from chatmem.memory.attachments import BadFile
from chatmem.memory.ports import TransientError

MAX_REDIRECTS = 5
TELEGRAM_FILE_PREFIX = "telegram:file/"
# The Bot API hands files to bots up to this size; getFile refuses larger ones.
TELEGRAM_DOWNLOAD_LIMIT = 20 * 1024 * 1024

# A bot token is "<bot id>:<secret>"; in Bot API URLs it follows "/bot".
_TOKEN_IN_URL = re.compile(r"(/bot)[^/\s'\"]+")
_BARE_TOKEN = re.compile(r"\b\d{3,}:[A-Za-z0-9_\-]{20,}")
# Loggers known to write Bot API URLs: httpx (every request, INFO; python-telegram-bot uses it too)
# and python-telegram-bot's bot classes (their base URL, DEBUG).
TOKEN_LOGGERS = ("httpx", "telegram.Bot", "telegram.ext.ExtBot")


def redact_bot_tokens(text: str, token: str | None = None) -> str:
    """`text` with every bot token replaced by `<token>`."""
    if token:
        text = text.replace(token, "<token>")
    return _BARE_TOKEN.sub("<token>", _TOKEN_IN_URL.sub(r"\1<token>", text))


class BotTokenFilter(logging.Filter):
    """Rewrites a record whose text contains a bot token. A filter on a logger sees only the
    records created on that very logger, so it is installed on each logger that needs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_bot_tokens(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_bot_tokens(logging.Formatter().formatException(record.exc_info))
        return True


def install_token_filter(names: Iterable[str] = TOKEN_LOGGERS) -> None:
    """Redact bot tokens in what these loggers write (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, BotTokenFilter) for f in logger.filters):
            logger.addFilter(BotTokenFilter())


@dataclass(frozen=True)
class TelegramFiles:
    """Where telegram:file/ references are resolved. `token` is a SecretStr so that no repr or
    traceback shows it."""

    api_url: str = "https://api.telegram.org"
    token: SecretStr | None = None


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int
    timeout_s: float
    allow_private: bool = False
    file_root: Path | None = None
    ca_file: Path | None = None
    # chatmem's own files, never read as an attachment: its data folder (the keys, the database,
    # the blobs), the key-encryption key and the .env that holds the tokens.
    refused: tuple[Path, ...] = ()


# Errors of the path itself: ENAMETOOLONG, ENOTDIR ("a/file/x"), ELOOP (a symlink loop), EINVAL.
_PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP, errno.EINVAL})


def _why(error: BaseException) -> str:
    return getattr(error, "strerror", None) or type(error).__name__


def _short(path: Path) -> str:
    """A path for a failure reason: a name too long to open is too long to store whole."""
    text = str(path)
    return text if len(text) <= 200 else text[:100] + "…" + text[-60:]


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of a regular file. A device (/dev/zero, /dev/urandom) reports no
    size and never ends, a FIFO blocks until someone writes: both are refused, on the descriptor
    itself (O_NONBLOCK: opening a FIFO does not wait), so the check and the read see one file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise BadFile(f"not a file: {_short(path)}")
        if not stat.S_ISREG(info.st_mode):
            raise BadFile(f"not a regular file (a device, FIFO or socket): {_short(path)}")
        if info.st_size > limit:
            raise BadFile(f"file is {info.st_size} bytes, above the limit of {limit}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:  # it grew since, or reports no size (/proc)
            raise BadFile(f"file is larger than the limit of {limit} bytes")
        return data
    finally:
        os.close(fd)


class UrlFetcher:
    def __init__(
        self,
        limits: FetchLimits,
        resolve: Callable[..., list[tuple[Any, ...]]] = socket.getaddrinfo,
        *,
        telegram: TelegramFiles | None = None,
    ):
        """`resolve` has getaddrinfo's shape (tests pass a stub); it is asked once per https hop."""
        self.limits = limits
        self._resolve = resolve
        self.telegram = telegram or TelegramFiles()

    def fetch(self, url: str) -> bytes:
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError:  # an unclosed [ in the host, say
            raise BadFile(f"malformed URL: {url[:200]}") from None
        if scheme == "data":
            return self._data(url)
        if scheme == "file":
            return self._file(url)
        if scheme == "https":
            return self._https(url)
        if scheme == "telegram":
            return self._telegram(url)
        raise BadFile(f"URL scheme {scheme or '(none)'!r} is not fetched (file, https, data and telegram are)")

    def _data(self, url: str) -> bytes:
        header, sep, body = url[5:].partition(",")
        if not sep:
            raise BadFile("malformed data: URI (no comma)")
        try:
            data = base64.b64decode(body, validate=True) if header.endswith(";base64") else unquote_to_bytes(body)
        except ValueError as error:
            raise BadFile(f"malformed data: URI ({error})") from None
        return self._sized(data)

    def _file(self, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise BadFile(f"file:// URL on another host ({parts.netloc}) is not fetched")
        if not parts.path.strip("/"):  # an empty path would resolve to the worker's own folder
            raise BadFile("file:// URL names no file")
        try:
            # The bytes the URL percent-encodes, named as the file system names them: what
            # Path.as_uri wrote, on a machine whose file names are not UTF-8 too.
            path = Path(os.fsdecode(unquote_to_bytes(parts.path))).resolve()
        except ValueError:
            raise BadFile("file path holds a NUL character") from None
        except RuntimeError:  # before Python 3.13
            raise BadFile("file path cannot be resolved: a symbolic link loop") from None
        except OSError as error:
            raise BadFile(f"file path cannot be resolved: {_why(error)}") from None
        root = self.limits.file_root
        if root is not None and not path.is_relative_to(Path(root).resolve()):
            raise BadFile(f"file {path} is outside the allowed folder")
        if any(path.is_relative_to(own.resolve()) for own in self.limits.refused):
            raise BadFile(f"file {_short(path)} is one of chatmem's own (its data folder, key or settings)")
        try:
            return _read_regular(path, self.limits.max_bytes)
        except FileNotFoundError:
            raise BadFile(f"file not found: {path}") from None
        except IsADirectoryError:
            raise BadFile(f"not a file: {path}") from None
        except PermissionError:
            raise BadFile(f"no permission to read {path}") from None
        except OSError as error:
            # A path that can never be read fails the file; anything else (EIO, EMFILE ...) may
            # pass, and is retried.
            if error.errno in _PATH_ERRNOS:
                raise BadFile(f"cannot read {_short(path)}: {_why(error)}") from None
            raise TransientError(f"cannot read {_short(path)} now: {_why(error)}") from None

    def _sized(self, data: bytes) -> bytes:
        if len(data) > self.limits.max_bytes:
            raise BadFile(f"attachment is {len(data)} bytes, above the limit of {self.limits.max_bytes}")
        return data

    def _addresses(self, host: str, port: int) -> list[str]:
        """The addresses `host` resolves to, in the resolver's order, every one of them checked.
        The request goes to one of these, never to a second answer for the same name."""
        try:
            infos = self._resolve(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise TransientError(f"cannot resolve {host}: {error}") from None
        except UnicodeError:  # IDNA refuses the name: an empty label, or one over 63 characters
            raise BadFile(f"malformed host name: {host[:200]}") from None
        addresses: list[str] = []
        for info in infos:
            ip = ipaddress.ip_address(info[4][0])
            if not self.limits.allow_private and _is_private(ip):
                raise BadFile(f"{host} resolves to a private address ({ip}); refused")
            if str(ip) not in addresses:
                addresses.append(str(ip))
        if not addresses:
            raise TransientError(f"cannot resolve {host}: no address")
        return addresses

    def _ssl_context(self) -> ssl.SSLContext:
        if self.limits.ca_file:
            return ssl.create_default_context(cafile=str(self.limits.ca_file))
        return httpx.create_ssl_context()  # certifi, or SSL_CERT_FILE / SSL_CERT_DIR when set

    def _https(self, url: str) -> bytes:
        lim = self.limits
        deadline = time.monotonic() + lim.timeout_s
        # trust_env=False: a proxy from the environment would resolve the name itself, after our
        # check. No keep-alive: a pooled connection is keyed by IP, and one verified for a host
        # name must not carry a request for another name that happens to share the address.
        with httpx.Client(
            verify=self._ssl_context(),
            timeout=lim.timeout_s,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as client:
            for hop in range(MAX_REDIRECTS + 1):
                target = _https_url(url, redirected=hop > 0)
                host = target.raw_host.decode("ascii")
                try:
                    response = self._send_pinned(client, target, deadline)
                    try:
                        if response.is_redirect:
                            url = urljoin(url, response.headers.get("location", ""))
                            continue
                        return self._read(response, deadline)
                    finally:
                        response.close()
                except httpx.TimeoutException as error:
                    raise TransientError(f"timed out fetching {host}: {error}") from None
                except httpx.TransportError as error:
                    raise TransientError(f"cannot reach {host}: {error}") from None
        raise BadFile(f"more than {MAX_REDIRECTS} redirects")

    def _send_pinned(self, client: httpx.Client, url: httpx.URL, deadline: float) -> httpx.Response:
        """Send GET `url` to a checked address of its host: the URL names the IP, the Host header
        and the TLS server name (SNI, and the name the certificate must match) stay the host's.
        Addresses are tried in the resolver's order while they refuse connections."""
        host = url.raw_host.decode("ascii")
        last: Exception | None = None
        for address in self._addresses(host, url.port or 443):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            request = client.build_request(
                "GET",
                url.copy_with(host=address),
                headers={"Host": url.netloc.decode("ascii")},
                extensions={"sni_hostname": host},
                timeout=min(self.limits.timeout_s, remaining),
            )
            try:
                return client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                if "CERTIFICATE_VERIFY_FAILED" in str(error):  # waiting does not fix a certificate
                    raise BadFile(f"{host} has an untrusted TLS certificate") from None
                last = error  # this address does not answer; the next one may
        if last is None:
            raise TransientError(f"timed out fetching {host}")
        raise TransientError(f"cannot reach {host}: {last}")

    def _read(self, response: httpx.Response, deadline: float) -> bytes:
        lim = self.limits
        status = response.status_code
        if status in (408, 425, 429) or status >= 500:
            raise TransientError(f"server answered {status}")
        if status >= 400:
            raise BadFile(f"server answered {status}")
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > lim.max_bytes:
            raise BadFile(f"attachment is {declared} bytes, above the limit of {lim.max_bytes}")
        body = bytearray()
        for piece in response.iter_bytes():
            body += piece
            if len(body) > lim.max_bytes:
                raise BadFile(f"attachment is larger than the limit of {lim.max_bytes} bytes")
            if time.monotonic() > deadline:
                raise TransientError(f"download took longer than {lim.timeout_s:g} s")
        return bytes(body)

    # --- Telegram -----------------------------------------------------------------------------
    def _telegram(self, url: str) -> bytes:
        file_id = url[len(TELEGRAM_FILE_PREFIX) :] if url.startswith(TELEGRAM_FILE_PREFIX) else ""
        if not re.fullmatch(r"[A-Za-z0-9_\-]{1,512}", file_id):
            raise BadFile("malformed telegram file reference (expected telegram:file/<file_id>)")
        token = self.telegram.token.get_secret_value() if self.telegram.token else ""
        if not token:
            raise BadFile("telegram file references need CHATMEM_TELEGRAM_BOT_TOKEN")
        install_token_filter(("httpx",))
        try:
            return self._telegram_download(file_id, token)
        except (BadFile, TransientError) as error:
            # Our own messages carry no URL; this is the last guard should one ever quote one.
            raise type(error)(redact_bot_tokens(str(error), token)) from None

    def _telegram_download(self, file_id: str, token: str) -> bytes:
        lim = self.limits
        base = self.telegram.api_url.rstrip("/")
        deadline = time.monotonic() + lim.timeout_s
        verify: str | bool = str(lim.ca_file) if lim.ca_file else True
        # Errors name "the Bot API", never the URL: the token is a path segment of every URL.
        try:
            with httpx.Client(verify=verify, timeout=lim.timeout_s, follow_redirects=False) as client:
                # POST keeps the file id out of the request line as well.
                answer = client.post(f"{base}/bot{token}/getFile", data={"file_id": file_id})
                info = _bot_api_result(answer)
                file_path = info.get("file_path")
                if not isinstance(file_path, str) or not file_path:
                    raise BadFile("the Bot API returned no file_path for this file (it cannot be downloaded)")
                if file_path.startswith("/"):
                    raise BadFile("the Bot API server runs in --local mode and returned a path on its disk")
                size = info.get("file_size")
                if isinstance(size, int) and size > lim.max_bytes:
                    raise BadFile(f"attachment is {size} bytes, above the limit of {lim.max_bytes}")
                with client.stream("GET", f"{base}/file/bot{token}/{quote(file_path)}") as response:
                    status = response.status_code
                    if 300 <= status < 400 or status in (401, 403, 404):
                        raise BadFile(f"the Bot API file download answered {status}")
                    return self._read(response, deadline)
        except httpx.TimeoutException:
            raise TransientError("timed out talking to the Telegram Bot API") from None
        except httpx.TransportError as error:
            raise TransientError(f"cannot reach the Telegram Bot API ({type(error).__name__})") from None


def _bot_api_result(response: httpx.Response) -> dict[str, Any]:
    """The `result` of a Bot API answer; BadFile for what retrying cannot fix, TransientError
    for what it may (rate limits, server errors)."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    description = str(body.get("description") or f"HTTP {status}")[:200]
    if status == 200 and body.get("ok") and isinstance(body.get("result"), dict):
        return body["result"]
    if status in (408, 425, 429) or status >= 500:
        raise TransientError(f"the Telegram Bot API answered getFile with {status}: {description}")
    if status in (401, 404):
        # 401: a wrong token; 404: a malformed one. Fixing the setting and retrying helps.
        raise BadFile(
            f"the Telegram Bot API refused the bot token ({status} {description}); check CHATMEM_TELEGRAM_BOT_TOKEN"
        )
    if "too big" in description.lower():
        limit_mb = TELEGRAM_DOWNLOAD_LIMIT // (1024 * 1024)
        raise BadFile(f"the file is larger than the {limit_mb} MB the Bot API lets bots download ({description})")
    if status == 200:
        raise BadFile("the Telegram Bot API gave a malformed getFile answer")
    raise BadFile(f"the Telegram Bot API refused the file: {description}")


def _https_url(url: str, *, redirected: bool = False) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise BadFile(f"malformed URL: {url[:200]}") from None
    if parsed.scheme != "https" or not parsed.raw_host:
        if redirected:
            raise BadFile(f"redirected to a URL that is not fetched: {url[:200]}")
        raise BadFile(f"https:// URL names no host: {url[:200]}")
    return parsed


# IPv6 forms that carry an IPv4 address a gateway will connect to (NAT64's well-known prefix).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _is_private(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Not a public unicast address, or an IPv6 address that stands for an IPv4 one that is not."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and _is_private(embedded):
            return True
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
        or not ip.is_global  # shared address space (100.64.0.0/10) is neither private nor global
    )
