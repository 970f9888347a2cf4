"""Videos: their pictures at evenly spaced moments, decoded by the FFmpeg that OpenCV's wheel
carries (rapidocr needs OpenCV already, so no second FFmpeg is loaded beside it), turned as shown
(a phone's display matrix), within the pixel limit, on one thread as OCR runs."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time

import numpy as np

from chatmem.adapters.images import THUMB, seen_before
from chatmem.memory.attachments import BadFile, VideoFrames, VideoInfo

# One picture per this many seconds of video, at least MIN_PICTURES (a clip of a few seconds may
# cut between scenes), at most the caller's limit (a long video is seen from start to end).
SECONDS_A_PICTURE = 5.0
MIN_PICTURES = 3
SHEET_TILES = 4  # the pictures a vision model is shown, tiled 2×2
SHEET_TILE = (512, 512)  # the box each is scaled into
# Pictures are kept at most this large (a 1080p phone video's): reading eight of a 4K video took
# the helper 280 MB at full size, 204 MB so (docs/benchmarks.md), and OCR finds text at 960 by
# default.
PICTURE_MAX_SIDE = 1920
SEQUENTIAL_MAX_S = 3600.0  # a video of unknown length is read from its start, this far at most
# Reaching a moment decodes every picture from the keyframe before it: a minute of 1080p H.264
# takes 1.4 s for eight (docs/benchmarks.md), but a long recording with rare keyframes may take
# minutes. Past this much decoding, the pictures found so far are read and no more are sought.
DECODING_BUDGET_S = 30.0


class OpenCvVideoReader:
    def __init__(self, max_pixels: int):
        self.max_pixels = max_pixels
        self._quiet = False

    def _silence(self) -> None:
        """FFmpeg and OpenCV write what they meet in a damaged file ("moov atom not found") to
        stderr, which the worker's log shares: in a JSON log, stray lines. The reason reaches the
        file's record as a BadFile instead. FFmpeg's level is read when its first video opens."""
        import cv2

        if not self._quiet:
            os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET
            cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
            self._quiet = True

    def frames(self, data: bytes, limit: int) -> VideoFrames:
        import cv2

        self._silence()
        # From a file: OpenCV's reading from a Python stream crashed the process (SIGSEGV) on damaged
        # videos that the same bytes in a file only fail to decode.
        fd, name = tempfile.mkstemp(prefix="chatmem-video-")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            cap = cv2.VideoCapture(name, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
        except cv2.error as error:
            raise BadFile(f"not a video FFmpeg can read: {_first_line(error)}") from None
        finally:
            # Gone from the folder at once (FFmpeg holds it open), so a helper killed at its time
            # limit leaves nothing behind; where an open file cannot be removed (Windows), after.
            with contextlib.suppress(OSError):
                os.unlink(name)
        try:
            if not cap.isOpened():
                raise BadFile("not a video FFmpeg can read")
            width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
            height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
            if width <= 0 or height <= 0:
                raise BadFile("the video has no pictures (a sound track alone)")
            if width * height > self.max_pixels:
                raise BadFile(f"video is {width}×{height}, above the limit of {self.max_pixels:,} pixels")
            fps = cap.get(cv2.CAP_PROP_FPS)
            count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
            seconds = count / fps if fps > 0 and count > 0 else None
            codec = _fourcc(cap.get(cv2.CAP_PROP_FOURCC))
            if seconds is not None:
                found = _at_moments(cap, moments(seconds, limit))
            else:  # a stream with no length in its header (a browser's recording): read it from the start
                found, seconds = _in_order(cap, limit, fps)
        finally:
            cap.release()
            with contextlib.suppress(OSError):
                os.unlink(name)
        if not found:
            raise BadFile("no picture of the video could be decoded")
        distinct = _distinct(found)
        pictures = [(t, _png(frame)) for t, frame in distinct]
        return VideoFrames(VideoInfo(width, height, seconds, codec), pictures, _sheet([f for _, f in distinct]))


def moments(seconds: float, limit: int) -> list[float]:
    """Evenly spaced moments, each the middle of its share of the video."""
    n = max(1, min(limit, max(MIN_PICTURES, math.ceil(seconds / SECONDS_A_PICTURE))))
    return [(i + 0.5) * seconds / n for i in range(n)]


def _at_moments(cap, times: list[float]) -> list[tuple[float, np.ndarray]]:  # noqa: ANN001 - a cv2.VideoCapture
    import cv2

    found = []
    deadline = time.monotonic() + DECODING_BUDGET_S
    for t in times:
        cap.set(cv2.CAP_PROP_POS_MSEC, t * 1000.0)
        ok, frame = cap.read()
        if ok and frame is not None:
            found.append((t, _shrunk(frame)))
        if found and time.monotonic() > deadline:
            break
    return found


def _in_order(cap, limit: int, fps: float) -> tuple[list[tuple[float, np.ndarray]], float | None]:  # noqa: ANN001
    """From the start: a picture every SECONDS_A_PICTURE, the spacing doubled (every other one
    kept) each time `limit` is passed, so a long video is still seen from start to end; and its
    length (None without a frame rate, or when the decoding budget ran out first)."""
    step = max(1, round(SECONDS_A_PICTURE * (fps if fps > 0 else 25.0)))
    last = int(SEQUENTIAL_MAX_S * (fps if fps > 0 else 25.0))
    found: list[tuple[float, np.ndarray]] = []
    n = 0
    deadline = time.monotonic() + DECODING_BUDGET_S
    while n <= last:
        if not cap.grab():
            return found, (n / fps if fps > 0 else None)  # the end: its length is known now
        if n % step == 0:
            ok, frame = cap.retrieve()
            if ok and frame is not None:
                found.append((n / fps if fps > 0 else float(len(found)), _shrunk(frame)))
                if len(found) > limit:
                    found, step = found[::2], step * 2
        n += 1
        if found and time.monotonic() > deadline:
            break
    return found, None  # stopped before the end: its length is not known


def _shrunk(frame: np.ndarray) -> np.ndarray:
    import cv2

    h, w = frame.shape[:2]
    scale = PICTURE_MAX_SIDE / max(h, w)
    if scale >= 1:
        return frame
    return cv2.resize(frame, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)


def _distinct(found: list[tuple[float, np.ndarray]]) -> list[tuple[float, np.ndarray]]:
    import cv2

    thumbs: list[np.ndarray] = []
    return [
        (t, frame)
        for t, frame in found
        if not seen_before(
            cv2.resize(cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY), THUMB, interpolation=cv2.INTER_AREA).astype(float),
            thumbs,
        )
    ]


def _png(frame: np.ndarray) -> bytes:
    import cv2

    ok, encoded = cv2.imencode(".png", frame, [cv2.IMWRITE_PNG_COMPRESSION, 1])  # fast: read once by OCR
    if not ok:
        raise BadFile("a picture of the video could not be encoded")
    return encoded.tobytes()


def _sheet(frames: list[np.ndarray]) -> bytes | None:
    """Up to SHEET_TILES pictures, evenly chosen, each scaled into SHEET_TILE and tiled 2×2 (one in
    a row, two side by side): what a vision model is shown, in one call."""
    import cv2

    if not frames:
        return None
    if len(frames) > SHEET_TILES:
        frames = [frames[round(i * (len(frames) - 1) / (SHEET_TILES - 1))] for i in range(SHEET_TILES)]
    tiles = []
    for frame in frames:
        h, w = frame.shape[:2]
        scale = min(SHEET_TILE[0] / w, SHEET_TILE[1] / h, 1.0)
        tile = cv2.resize(frame, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
        box = np.full((SHEET_TILE[1], SHEET_TILE[0], 3), 255, np.uint8)
        y, x = (SHEET_TILE[1] - tile.shape[0]) // 2, (SHEET_TILE[0] - tile.shape[1]) // 2
        box[y : y + tile.shape[0], x : x + tile.shape[1]] = tile
        tiles.append(box)
    rows = [np.hstack(tiles[i : i + 2]) for i in range(0, len(tiles), 2)]
    width = max(r.shape[1] for r in rows)
    rows = [np.hstack([r, np.full((r.shape[0], width - r.shape[1], 3), 255, np.uint8)]) for r in rows]
    ok, encoded = cv2.imencode(".jpg", np.vstack(rows), [cv2.IMWRITE_JPEG_QUALITY, 85])
    return encoded.tobytes() if ok else None


def _fourcc(value: float) -> str:
    """The codec's four letters (h264, hevc, VP90); what a damaged header gives is no number."""
    if not math.isfinite(value):
        return ""
    letters = (int(value) & 0xFFFFFFFF).to_bytes(4, "little").decode("latin-1").strip("\x00 ")
    return letters if letters.isascii() and letters.isprintable() else ""


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
