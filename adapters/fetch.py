"""Fetching attachment bytes from file://, https://, data: and telegram:file/ URLs, within limits.

https:// downloads stream with a size cap and a time limit; every address a host name resolves
to is checked, and private, loopback, link-local and reserved ones are refused unless allowed
(the URL comes from chat content; the worker must not become a way into the private network).
Redirects are followed by hand so each hop is checked the same way.

`telegram:file/<file_id>` names a file a Telegram bot received. It is resolved through the Bot
API (`getFile`, then the file download) with the bot token from the settings; the API base is
trusted configuration, so the private-address check does not apply to it. The token is part of
every Bot API URL, so no URL is ever put in an error, and the `httpx` logger (which logs request
URLs at INFO) gets a filter that redacts bot tokens."""

from __future__ import annotations

import base64
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, unquote_to_bytes, urljoin, urlsplit

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


class UrlFetcher:
    def __init__(self, limits: FetchLimits, resolve=socket.getaddrinfo, *, telegram: TelegramFiles | None = None):  # noqa: ANN001
        self.limits = limits
        self._resolve = resolve
        self.telegram = telegram or TelegramFiles()

    def fetch(self, url: str) -> bytes:
        scheme = urlsplit(url).scheme.lower()
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
        path = Path(unquote(parts.path)).resolve()
        root = self.limits.file_root
        if root is not None and not path.is_relative_to(Path(root).resolve()):
            raise BadFile(f"file {path} is outside the allowed folder")
        try:
            size = path.stat().st_size
            if size > self.limits.max_bytes:
                raise BadFile(f"file is {size} bytes, above the limit of {self.limits.max_bytes}")
            return path.read_bytes()
        except FileNotFoundError:
            raise BadFile(f"file not found: {path}") from None
        except IsADirectoryError:
            raise BadFile(f"not a file: {path}") from None
        except PermissionError:
            raise BadFile(f"no permission to read {path}") from None

    def _sized(self, data: bytes) -> bytes:
        if len(data) > self.limits.max_bytes:
            raise BadFile(f"attachment is {len(data)} bytes, above the limit of {self.limits.max_bytes}")
        return data

    def _check_host(self, host: str, port: int) -> None:
        if self.limits.allow_private:
            return
        try:
            infos = self._resolve(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise TransientError(f"cannot resolve {host}: {error}") from None
        for info in infos:
            ip = ipaddress.ip_address(info[4][0])
            if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast:
                raise BadFile(f"{host} resolves to a private address ({ip}); refused")

    def _https(self, url: str) -> bytes:
        lim = self.limits
        deadline = time.monotonic() + lim.timeout_s
        verify: str | bool = str(lim.ca_file) if lim.ca_file else True
        with httpx.Client(verify=verify, timeout=lim.timeout_s, follow_redirects=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                parts = urlsplit(url)
                if parts.scheme.lower() != "https" or not parts.hostname:
                    raise BadFile(f"redirected to a URL that is not fetched: {url[:200]}")
                self._check_host(parts.hostname, parts.port or 443)
                try:
                    with client.stream("GET", url) as response:
                        if response.is_redirect:
                            url = urljoin(url, response.headers.get("location", ""))
                            continue
                        return self._read(response, deadline)
                except httpx.TimeoutException as error:
                    raise TransientError(f"timed out fetching {parts.hostname}: {error}") from None
                except httpx.TransportError as error:
                    if "CERTIFICATE_VERIFY_FAILED" in str(error):  # waiting does not fix a certificate
                        raise BadFile(f"{parts.hostname} has an untrusted TLS certificate") from None
                    raise TransientError(f"cannot reach {parts.hostname}: {error}") from None
        raise BadFile(f"more than {MAX_REDIRECTS} redirects")

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
