"""Fetching attachment bytes from file://, https:// and data: URLs, within limits.

https:// downloads stream with a size cap and a time limit; every address a host name resolves
to is checked, and private, loopback, link-local and reserved ones are refused unless allowed
(the URL comes from chat content; the worker must not become a way into the private network).
Redirects are followed by hand so each hop is checked the same way."""

from __future__ import annotations

import base64
import ipaddress
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urljoin, urlsplit

import httpx

from chatmem.memory.attachments import BadFile
from chatmem.memory.ports import TransientError

MAX_REDIRECTS = 5


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int
    timeout_s: float
    allow_private: bool = False
    file_root: Path | None = None
    ca_file: Path | None = None


class UrlFetcher:
    def __init__(self, limits: FetchLimits, resolve=socket.getaddrinfo):  # noqa: ANN001
        self.limits = limits
        self._resolve = resolve

    def fetch(self, url: str) -> bytes:
        scheme = urlsplit(url).scheme.lower()
        if scheme == "data":
            return self._data(url)
        if scheme == "file":
            return self._file(url)
        if scheme == "https":
            return self._https(url)
        raise BadFile(f"URL scheme {scheme or '(none)'!r} is not fetched (file, https and data are)")

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
