"""Videos read by the real readers: OpenCV's FFmpeg for the pictures, rapidocr for their text, in
the helper process the worker uses. The files (tests/fixtures/videos/README.md) are as phones,
browsers and chat apps write them: H.264 and HEVC in MP4 and QuickTime, VP8 and VP9 in WebM,
one stored on its side, one with no length in its header."""

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chatmem.adapters.analysis_runner import IsolatedReader, ReaderSpec
from chatmem.adapters.images import PillowImageReader, RapidOcr, guess_binary
from chatmem.adapters.video import OpenCvVideoReader, moments
from chatmem.memory.attachments import BadFile, Reader, sniff
from chatmem.memory.attachments.analysis import VIDEO_PICTURES_MAX
from tests import emulator
from tests.fakes import FakeDocumentReader

pytestmark = pytest.mark.integration
VIDEOS = Path(__file__).parents[1] / "fixtures" / "videos"


def video(name: str) -> bytes:
    return (VIDEOS / name).read_bytes()


@pytest.fixture(scope="module")
def reader() -> Reader:
    images = PillowImageReader(40_000_000)
    return Reader(images, RapidOcr(images, max_side=960), FakeDocumentReader(), OpenCvVideoReader(40_000_000))


@pytest.mark.parametrize(
    ("name", "mime", "shown", "seconds", "codec", "words"),
    [
        ("phone.mp4", "video/mp4", (640, 360), 8.0, "h264", ["GATE B12", "BOARDING 18:40", "SEAT 14C", "LISBON"]),
        ("turned.mov", "video/quicktime", (360, 640), 3.0, "hevc", ["ROOM 305", "CHECKOUT 11"]),
        ("screen.webm", "video/webm", (640, 360), 3.0, "VP90", ["INVOICE 2291", "TOTAL 950 EUR"]),
        ("animation.mp4", "video/mp4", (480, 270), 2.0, "h264", ["HAPPY BIRTHDAY", "MARTA"]),
        ("live.webm", "video/webm", (640, 360), 12.0, "VP80", ["MEETING ROOM 4", "AGENDA ITEM 2"]),
    ],
)
def test_the_text_in_a_videos_pictures_is_read_as_shown(reader, name, mime, shown, seconds, codec, words):
    data = video(name)
    sniffed = sniff(data, name, guess_binary)
    assert (sniffed.mime, sniffed.kind) == (mime, "video")
    found = reader(data, sniffed)
    assert found.video is not None
    assert (found.video.width, found.video.height) == shown  # the .mov upright, by its display matrix
    assert found.video.seconds == pytest.approx(seconds, abs=0.2) and found.video.codec == codec
    assert [line.upper() for line in found.lines] == words  # each scene's lines once, in order
    assert found.sheet is not None and found.sheet.startswith(b"\xff\xd8")  # a JPEG for a vision model


def test_a_still_video_is_read_once_and_a_changing_one_at_each_scene():
    videos = OpenCvVideoReader(40_000_000)
    still = videos.frames(video("animation.mp4"), VIDEO_PICTURES_MAX)  # three moments, one picture
    assert len(still.pictures) == 1
    two = videos.frames(video("phone.mp4"), VIDEO_PICTURES_MAX)
    assert [round(t, 2) for t, _ in two.pictures] == [1.33, 4.0]  # of 1.33, 4.0 and 6.67: the third is the second
    # A browser's recording has no length: read from its start, a picture every 5 s.
    assert [t for t, _ in videos.frames(video("live.webm"), VIDEO_PICTURES_MAX).pictures] == [0.0, 10.0]


def test_moments_spread_over_the_video_within_the_limit():
    assert moments(2.0, 8) == pytest.approx([1 / 3, 1.0, 5 / 3])  # at least three: a clip may cut
    assert len(moments(30.0, 8)) == 6 and len(moments(3600.0, 8)) == 8
    assert moments(3600.0, 8)[-1] == pytest.approx(3375.0)


def test_a_video_larger_than_the_pixel_limit_is_refused_by_its_header():
    with pytest.raises(BadFile, match="640×360, above the limit of 100,000 pixels"):
        OpenCvVideoReader(100_000).frames(video("phone.mp4"), 8)


def test_damaged_videos_fail_with_a_reason_and_leave_no_file_behind(tmp_path, monkeypatch):
    # Reading from a Python stream crashed the process on some of these; from a file, they fail.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    videos = OpenCvVideoReader(40_000_000)
    rng = random.Random(7)
    data = video("phone.mp4")
    outcomes = set()
    for _ in range(60):
        broken = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            broken[rng.randrange(len(broken))] = rng.randrange(256)
        try:
            videos.frames(bytes(broken[: rng.randrange(len(broken) // 2, len(broken))]), 8)
            outcomes.add("read")
        except BadFile:
            outcomes.add("refused")
    assert outcomes == {"read", "refused"}
    with pytest.raises(BadFile, match="not a video FFmpeg can read"):
        videos.frames(data[:20] + bytes(500), 8)
    assert list(tmp_path.iterdir()) == []


def test_a_video_is_read_in_the_helper_process():
    spec = ReaderSpec(
        max_pixels=40_000_000,
        ocr_max_side=960,
        ocr_threads=1,
        max_pages=10,
        max_chars=100_000,
        max_pdf_pages=100,
        max_decoded_bytes=10_000_000,
    )
    helper = IsolatedReader(spec, timeout_s=60)
    try:
        data = video("turned.mov")
        found = helper(data, sniff(data, "IMG_0042.MOV", guess_binary))
    finally:
        helper.close()
    assert [line.upper() for line in found.lines] == ["ROOM 305", "CHECKOUT 11"]
    assert found.meta == {"pictures_read": 1}


def test_past_the_decoding_budget_the_pictures_found_so_far_are_read(monkeypatch):
    # A long recording with rare keyframes costs a long decoding a moment: the budget stops it.
    from chatmem.adapters import video as module

    monkeypatch.setattr(module, "DECODING_BUDGET_S", 0.0)
    videos = OpenCvVideoReader(40_000_000)
    sought = videos.frames(video("phone.mp4"), VIDEO_PICTURES_MAX)
    assert [round(t, 2) for t, _ in sought.pictures] == [1.33] and sought.info.seconds == 8.0
    read = videos.frames(video("live.webm"), VIDEO_PICTURES_MAX)  # from the start: its end was not reached
    assert [t for t, _ in read.pictures] == [0.0] and read.info.seconds is None


DIGESTS = """
import hashlib, sys
from pathlib import Path
from chatmem.adapters.video import OpenCvVideoReader
for path in sys.argv[1:]:
    seen = OpenCvVideoReader(40_000_000).frames(Path(path).read_bytes(), 8)
    print(Path(path).name, seen.info, [hashlib.sha256(png).hexdigest()[:16] for _, png in seen.pictures])
"""


@pytest.mark.emulated
@pytest.mark.parametrize("cpu", [emulator.HASWELL, emulator.NEHALEM])
def test_videos_decode_to_the_same_pictures_on_cpus_without_avx512_or_avx2(cpu):
    # FFmpeg picks its AVX-512 and AVX2 code with cpuid at run time; this machine may have both.
    # Under an emulated Haswell (AVX2, no AVX-512) and Nehalem (neither) the same pictures come out.
    paths = [str(p) for p in sorted(VIDEOS.glob("*")) if p.suffix != ".md"]
    command = [sys.executable, "-c", DIGESTS, *paths]
    native = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    command, env = emulator.emulated(cpu, command)
    emulated = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env).stdout
    assert native.count("VideoInfo") == len(paths) and emulated == native


# Each picture's pixels as a .npy file in argv[1], for a comparison that allows rounding.
PICTURES = """
import sys
from pathlib import Path
import cv2, numpy as np
from chatmem.adapters.video import OpenCvVideoReader
out = Path(sys.argv[1])
for path in map(Path, sys.argv[2:]):
    seen = OpenCvVideoReader(40_000_000).frames(path.read_bytes(), 8)
    print(path.name, seen.info, [moment for moment, _ in seen.pictures])
    for i, (_, png) in enumerate(seen.pictures):
        np.save(out / f"{path.stem}-{i}.npy", cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR))
"""


@pytest.mark.emulated
def test_videos_decode_on_arm_to_the_pictures_decoded_here(tmp_path):
    # OpenCV's aarch64 wheel carries its own FFmpeg build, with NEON code, for Linux on ARM. The
    # same moments come out with the same pictures; only the conversion from the video's colours
    # rounds its own way there, by one level at most (seen: a few pixels in a hundred).
    paths = [str(p) for p in sorted(VIDEOS.glob("*")) if p.suffix != ".md"]
    here, arm = tmp_path / "here", tmp_path / "arm"
    here.mkdir(), arm.mkdir()
    command = [sys.executable, "-c", PICTURES, str(here), *paths]
    native = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    command, env = emulator.arm_python(emulator.ARM_MAX, PICTURES, str(arm), *paths)
    emulated = subprocess.run(command, capture_output=True, text=True, check=True, timeout=240, env=env).stdout
    assert native.count("VideoInfo") == len(paths) and emulated == native
    names = sorted(p.name for p in here.glob("*.npy"))
    assert len(names) >= len(paths) and names == sorted(p.name for p in arm.glob("*.npy"))
    for name in names:
        mine, theirs = np.load(here / name).astype(int), np.load(arm / name).astype(int)
        assert mine.shape == theirs.shape and np.abs(mine - theirs).max() <= 1, name


def test_what_ffmpeg_meets_in_a_damaged_video_stays_out_of_the_workers_log():
    # The reading helper shares the worker's stderr: in a JSON log, FFmpeg's "moov atom not found"
    # and OpenCV's warnings would be stray lines. The reason is the BadFile's.
    script = (
        "from chatmem.adapters.video import OpenCvVideoReader\n"
        "from chatmem.memory.attachments import BadFile\n"
        "for data in (bytes(24) + bytes(300), b'\\x00\\x00\\x00\\x18ftypmp42' + bytes(300)):\n"
        "    try:\n"
        "        OpenCvVideoReader(40_000_000).frames(data, 8)\n"
        "    except BadFile as error:\n"
        "        print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines() == ["not a video FFmpeg can read"] * 2 and done.stderr == ""
