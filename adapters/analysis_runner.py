"""Reading attachments (decoding, OCR, PDF text) in a helper process, each file within a time limit.

A pathological file can keep a reader busy for as long as it likes (a content stream that takes
minutes to parse, an image that makes the text detector crawl), and Python cannot interrupt
that from inside. So the Read port runs in one persistent helper process per worker process: it
keeps the OCR models loaded between jobs, and a job that passes its limit gets the helper killed
(SIGKILL) and fails as a BadFile with the reason. The next job starts a fresh helper. The worker
process never runs the reading code itself, so it survives what a file does to the reader (a
hang, a crash; on Linux the helper is also the first candidate of the OOM killer) and takes the
next job.

The helper is `python -m chatmem.adapters.analysis_runner`, started with subprocess rather than
multiprocessing: Celery's pool processes are daemonic and multiprocessing refuses to start
children from them, and a fresh interpreter inherits no threads, locks or connections from the
worker. The two ends talk over a socketpair in length-prefixed pickles; both ends are this module
on one machine, so pickle's trust model holds."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chatmem.memory.attachments import BadFile, Extraction, Read, Reader, Sniffed
from chatmem.memory.ports import TransientError

_HEADER = struct.Struct("!Q")
DEFAULT_FACTORY = "chatmem.adapters.analysis_runner:build_reader"


@dataclass(frozen=True)
class ReaderSpec:
    """What the helper builds its Reader from (values from the settings). `factory` names a
    `module:function` taking this spec and returning the Read port; tests name their own."""

    max_pixels: int
    ocr_max_side: int
    ocr_threads: int
    max_pages: int
    max_chars: int
    max_pdf_pages: int
    max_decoded_bytes: int
    preload_ocr: bool = True  # load the OCR models at start, outside any job's time
    factory: str = DEFAULT_FACTORY
    log_format: str = "text"  # the worker's, so its warnings come out in the same format


def build_reader(spec: ReaderSpec) -> Read:
    """The production Read port: Pillow, rapidocr, the document reader and OpenCV's FFmpeg for
    videos, within the limits."""
    from chatmem.adapters.documents import DocumentReader
    from chatmem.adapters.images import PillowImageReader, RapidOcr
    from chatmem.adapters.video import OpenCvVideoReader

    images = PillowImageReader(spec.max_pixels)
    ocr = RapidOcr(images, spec.ocr_max_side, spec.ocr_threads)
    if spec.preload_ocr:
        ocr.engine  # noqa: B018 - about a second: paid when the helper starts, not by a job
    documents = DocumentReader(
        spec.max_pages, spec.max_chars, max_pdf_pages=spec.max_pdf_pages, max_decoded_bytes=spec.max_decoded_bytes
    )
    return Reader(images, ocr, documents, OpenCvVideoReader(spec.max_pixels))


class ReaderFailed(RuntimeError):
    """The reader raised something unexpected (a bug, not a verdict on the file); it propagates
    as it would in process, so the job releases its claim and the task fails visibly."""


class IsolatedReader:
    """The Read port in a helper process: each call within `timeout_s`. A call that passes it, or
    during which the helper dies, is a BadFile; the helper is then replaced on the next call.
    Calls are serialised (one helper, one file at a time)."""

    def __init__(self, spec: ReaderSpec, timeout_s: float, *, start_timeout_s: float = 120.0) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._helper: _Helper | None = None

    @property
    def pid(self) -> int | None:
        """The helper's process id, if one is running for this process."""
        helper = self._helper
        return helper.proc.pid if helper is not None and helper.alive() else None

    def start(self) -> int:
        """Start the helper now (a worker warming up) and return its pid."""
        with self._lock:
            return self._running().proc.pid

    def __call__(self, data: bytes, sniffed: Sniffed) -> Extraction:
        with self._lock:
            helper = self._running()
            deadline = time.monotonic() + self.timeout_s
            try:
                _send(helper.sock, (data, sniffed.mime, sniffed.kind), deadline)
                status, value = _receive(helper.sock, deadline)
            except TimeoutError:
                self._stop()
                raise BadFile(f"analysis took longer than {self.timeout_s:g} s; it was stopped") from None
            except (EOFError, OSError, pickle.UnpicklingError):
                how = self._stop()
                raise BadFile(f"the reading process died while reading this file ({how})") from None
            except BaseException:
                # Interrupted mid-exchange (Celery's soft time limit, a KeyboardInterrupt): a reply
                # may still come, and the next request must not read it as its own.
                self._stop()
                raise
        if status == "ok":
            assert isinstance(value, Extraction)
            return value
        if status == "bad":
            raise BadFile(str(value))
        raise ReaderFailed(str(value))

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> _Helper:
        helper = self._helper
        if helper is not None and helper.owner == os.getpid() and helper.alive():
            return helper
        if helper is not None and helper.owner == os.getpid():
            self._stop()
        # A helper started by the process this one was forked from is that process's: leave it.
        self._helper = helper = _Helper.start(self.spec, self.start_timeout_s)
        return helper

    def _stop(self) -> str:
        """Kill the helper (if any) and say how it ended."""
        helper, self._helper = self._helper, None
        return helper.stop() if helper is not None else "not running"


class _Helper:
    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.owner = os.getpid()
        # Kills the helper if the IsolatedReader is dropped or the interpreter exits.
        self._finalizer = weakref.finalize(self, _kill, proc, sock, self.owner)

    @classmethod
    def start(cls, spec: ReaderSpec, start_timeout_s: float) -> _Helper:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chatmem.adapters.analysis_runner",
                    str(theirs.fileno()),
                    str(os.getpid()),
                    json.dumps(asdict(spec)),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                # Its own session: a Ctrl-C or a signal to the worker's process group must not end
                # a read half-way (which would read as a file that crashed the reader).
                start_new_session=True,
            )
        finally:
            theirs.close()
        helper = cls(proc, ours)
        try:
            status, value = _receive(ours, time.monotonic() + start_timeout_s)
        except (TimeoutError, EOFError, OSError) as error:
            how = helper.stop()
            raise TransientError(f"the reading process did not start ({type(error).__name__}; {how})") from None
        if status != "ready":
            helper.stop()
            raise TransientError(f"the reading process did not start: {value}")
        return helper

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        self._finalizer()
        return _ended(self.proc.returncode)


def _kill(proc: subprocess.Popen[bytes], sock: socket.socket, owner: int) -> None:
    sock.close()
    if os.getpid() != owner:  # a forked copy of the worker: the helper is the parent's, not ours
        return
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # a process in uninterruptible sleep; the OS reaps it later
        pass


def _ended(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# --- the wire -----------------------------------------------------------------------------------


def _send(sock: socket.socket, message: object, deadline: float | None) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.settimeout(_remaining(deadline))
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _receive(sock: socket.socket, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_exactly(sock, _HEADER.size, deadline))
    return pickle.loads(_exactly(sock, size, deadline))


def _exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        sock.settimeout(_remaining(deadline))
        piece = sock.recv(min(size - len(buffer), 1 << 20))
        if not piece:
            raise EOFError("the other end closed the connection")
        buffer += piece
    return bytes(buffer)


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


# --- the helper process ------------------------------------------------------------------------


def _load(factory: str) -> Callable[[ReaderSpec], Read]:
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)


def _exit_with(parent: int) -> None:
    """Exit when the worker that started us is gone, even in the middle of a read (the socket's
    end-of-file is only seen between reads)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(sock: socket.socket, read: Read) -> None:
    """Answer read requests until the worker closes its end."""
    while True:
        try:
            data, mime, kind = _receive(sock, None)
        except EOFError:
            return
        try:
            reply: tuple[str, object] = ("ok", read(data, Sniffed(mime, kind)))
        except BadFile as error:
            reply = ("bad", error.reason)
        except Exception as error:  # noqa: BLE001 - reported to the worker, which raises it
            reply = ("error", f"{type(error).__name__}: {error}")
        _send(sock, reply, None)


def main(argv: list[str]) -> None:
    import logging

    from chatmem.adapters.logs import configure_logging

    fd, parent, spec_json = argv
    sock = socket.socket(fileno=int(fd))
    _exit_with(int(parent))
    try:  # Linux: if a file eats the memory, the kernel's OOM killer takes this process, not the worker
        with open("/proc/self/oom_score_adj", "w", encoding="utf-8") as adj:
            adj.write("1000")
    except OSError:
        pass
    try:
        spec = ReaderSpec(**json.loads(spec_json))
        configure_logging("WARNING", spec.log_format)
        # pypdf logs a warning per oddity; a hostile PDF has thousands. The reason of a failure
        # is recorded with the attachment.
        logging.getLogger("pypdf").setLevel(logging.ERROR)
        read = _load(spec.factory)(spec)
    except Exception as error:  # noqa: BLE001 - reported to the worker, which raises it
        _send(sock, ("failed", f"{type(error).__name__}: {error}"), None)
        return
    _send(sock, ("ready", os.getpid()), None)
    serve(sock, read)


if __name__ == "__main__":
    main(sys.argv[1:])
