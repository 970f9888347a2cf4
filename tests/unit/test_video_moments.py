"""Which pictures of a video are read, over a stand-in for OpenCV's capture (the same calls:
grab, retrieve, set, read); the real decoder is in tests/integration/test_video.py."""

import numpy as np

from chatmem.adapters import video
from chatmem.adapters.video import PICTURE_MAX_SIDE, _at_moments, _fourcc, _in_order, _shrunk


class Capture:
    """A video of `frames` pictures at `fps`, each picture its own index in every pixel."""

    def __init__(self, frames: int, fps: float, broken: set[int] | None = None) -> None:
        self.frames, self.fps, self.broken = frames, fps, broken or set()
        self.at = -1
        self.grabs = 0

    def grab(self) -> bool:
        self.at += 1
        self.grabs += 1
        return self.at < self.frames

    def retrieve(self):  # noqa: ANN201
        if self.at in self.broken:
            return False, None
        return True, np.full((2, 2, 3), self.at % 256, np.uint8)

    def set(self, prop: int, ms: float) -> bool:
        self.at = round(ms / 1000 * self.fps) - 1
        return True

    def read(self):  # noqa: ANN201
        return self.retrieve() if self.grab() else (False, None)


def test_a_stream_of_unknown_length_is_seen_from_start_to_end_within_the_limit():
    # 200 s at 10 pictures a second: one every 5 s would be 40; the spacing doubles until 8 fit.
    cap = Capture(2000, 10.0)
    found, seconds = _in_order(cap, 8, 10.0)
    times = [t for t, _ in found]
    assert times == [0.0, 40.0, 80.0, 120.0, 160.0] and seconds == 200.0
    assert cap.grabs == 2001  # read once to its end, never twice


def test_a_picture_that_does_not_decode_is_passed_over():
    found, seconds = _in_order(Capture(120, 10.0, broken={0}), 8, 10.0)
    assert [t for t, _ in found] == [5.0, 10.0] and seconds == 12.0
    assert [t for t, _ in _at_moments(Capture(100, 10.0, broken={50}), [2.0, 5.0, 8.0])] == [2.0, 8.0]


def test_without_a_frame_rate_pictures_are_counted_and_the_length_is_unknown():
    found, seconds = _in_order(Capture(300, 0.0), 8, 0.0)
    assert [t for t, _ in found] == [0.0, 1.0, 2.0] and seconds is None  # 25 a second assumed: every 125th


def test_the_decoding_budget_stops_a_long_read_after_the_first_picture(monkeypatch):
    monkeypatch.setattr(video, "DECODING_BUDGET_S", 0.0)
    found, seconds = _in_order(Capture(2000, 10.0), 8, 10.0)
    assert [t for t, _ in found] == [0.0] and seconds is None
    assert [t for t, _ in _at_moments(Capture(100, 10.0), [1.0, 5.0, 9.0])] == [1.0]


def test_a_codec_is_named_by_its_four_letters_and_a_damaged_header_by_none():
    assert _fourcc(float(int.from_bytes(b"h264", "little"))) == "h264"
    assert [_fourcc(v) for v in (-1.0, float("nan"), float("inf"), 1e30, 0.0)] == [""] * 5


def test_a_picture_larger_than_1080p_is_kept_at_1080p():
    assert _shrunk(np.zeros((2160, 3840, 3), np.uint8)).shape == (1080, 1920, 3)
    assert _shrunk(np.zeros((3840, 2160, 3), np.uint8)).shape == (1920, 1080, 3)  # upright, as shown
    small = np.zeros((720, 1280, 3), np.uint8)
    assert _shrunk(small) is small and PICTURE_MAX_SIDE == 1920
