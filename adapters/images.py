"""Images: decoding within limits (Pillow, with pi-heif-decoder's plugin for HEIC), type sniffing
from magic numbers (filetype), and OCR with rapidocr, whose detection and recognition models ship
inside its wheel."""

from __future__ import annotations

import io
import logging
import re
import threading
import warnings
from functools import cache

import numpy as np

from chatmem.memory.attachments import BadFile, ImageInfo

_EXIF_TAGS = {271: "camera_make", 272: "camera_model", 306: "modified_at", 36867: "taken_at"}
# HEIF still images coded in HEVC, by their file's brand. `filetype` knows `heic` (and `mif1` or
# `msf1` naming it), not the 10-bit and layered `heix`, `heim` and `heis` some phones and cameras write.
_HEIC_BRANDS = {b"heic", b"heix", b"heim", b"heis"}


def guess_binary(data: bytes) -> str | None:
    """The MIME type named by the file's magic number, or None for text and unknown bytes."""
    import filetype

    from chatmem.adapters.ole import CFB_MAGIC, compound_type

    if data.startswith(CFB_MAGIC):
        # filetype tells Office 97-2003 files apart by their first sectors, which vary with the
        # program that saved them (it takes PowerPoint files for Excel ones); their streams say.
        return compound_type(data)
    kind = filetype.guess(data[:8192])
    if kind:
        return kind.mime
    return "image/heic" if data[4:8] == b"ftyp" and data[8:12] in _HEIC_BRANDS else None


@cache
def open_heic_too() -> None:
    """Let Pillow open HEIC photos. Only the primary image is read (no thumbnails, depth maps or
    other auxiliary images), on one thread, as OCR runs."""
    from pi_heif import register_heif_opener

    register_heif_opener(decode_threads=1, thumbnails=False, depth_images=False, aux_images=False)


class PillowImageReader:
    def __init__(self, max_pixels: int):
        from PIL import Image

        self.max_pixels = max_pixels
        open_heic_too()
        # Pillow refuses images above twice its own MAX_IMAGE_PIXELS (about 179 M pixels) inside
        # Image.open, before we see the size. Our limit is the one that counts: never let
        # Pillow's ceiling sit below it (it stays above, as a backstop for frames and tiles).
        if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
            Image.MAX_IMAGE_PIXELS = max_pixels

    def _too_large(self, size: str) -> BadFile:
        return BadFile(f"image is {size}, above the limit of {self.max_pixels:,} (a decompression bomb?)")

    def open(self, data: bytes):  # noqa: ANN201 - a PIL image, fully decoded, RGB
        from PIL import Image, UnidentifiedImageError

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit follows
                img = Image.open(io.BytesIO(data))  # lazy: reads the header only
                # The header alone says how big the decoded image would be: check before decoding.
                pixels = img.width * img.height
                if pixels > self.max_pixels:
                    raise self._too_large(f"{img.width}×{img.height} ({pixels:,} pixels)")
                img.load()
        except BadFile:
            raise
        except Image.DecompressionBombError as error:
            # Pillow's backstop fired first (in Image.open, or for a frame or tile); it names the
            # pixel count only.
            found = re.search(r"\((\d+) pixels\)", str(error))
            raise self._too_large(f"{int(found[1]):,} pixels" if found else "too large") from None
        except UnidentifiedImageError:
            raise BadFile("not an image Pillow can read") from None
        except (OSError, SyntaxError, ValueError, EOFError, RuntimeError) as error:
            # EOFError and RuntimeError: the HEIC plugin's for data its decoder cannot finish.
            raise BadFile(f"corrupt image: {error}") from None
        _upright(img)
        return img

    def inspect(self, data: bytes) -> ImageInfo:
        img = self.open(data)
        meta: dict[str, str] = {}
        if (count := _pictures_in(img)) > 1:
            meta["frames"] = str(count)
        try:
            exif = img.getexif()
            for tag, name in _EXIF_TAGS.items():
                value = exif.get(tag)
                if isinstance(value, str) and value.strip():
                    meta[name] = value.strip()[:64]
        except Exception:  # noqa: BLE001 - broken EXIF is not a broken image
            pass
        return ImageInfo(img.format or "image", img.width, img.height, meta)

    def rgb(self, data: bytes) -> np.ndarray:
        return np.asarray(_on_white(eight_bit(self.open(data))))

    def frames(self, data: bytes, limit: int) -> list[bytes]:
        """An animation's other pictures (a GIF's, a WebP's, an APNG's; a TIFF's other pages), evenly spaced, at most
        `limit`, each unlike the first and those kept before it, as PNG; none for a still image.
        Every picture has the size the header declared, which `open` held to the limit."""
        img = self.open(data)
        count = min(_pictures_in(img), ANIMATION_FRAMES_SEEN)
        if count <= 1 or limit <= 0:
            return []
        picks = (
            range(1, count)
            if count - 1 <= limit
            else [round(1 + i * (count - 2) / (limit - 1 or 1)) for i in range(limit)]
        )
        thumbs = [_thumb(_on_white(img))]
        found: list[bytes] = []
        for index in dict.fromkeys(picks):
            try:
                img.seek(index)
                picture = _on_white(img)
            except (EOFError, OSError, ValueError, SyntaxError):  # a frame cut short: the rest are gone too
                break
            if seen_before(_thumb(picture), thumbs):
                continue
            out = io.BytesIO()
            picture.save(out, "PNG", compress_level=1)
            found.append(out.getvalue())
        return found


# An animation is read at up to this many of its pictures' positions, and no further than this
# many pictures in (Pillow reads a GIF's pictures one after another to reach one).
ANIMATION_FRAMES_SEEN = 2_000
# Two pictures whose small grey thumbnails differ by less than this (mean, of 255) are one still
# picture (a GIF's loop, a slide held in a video): the second is not worth its OCR. Two cards of
# different text on white differ by 3; a camera's noise alone may pass the bar, which only costs
# an OCR. Shared with adapters/video.py.
SAME_PICTURE = 1.0
THUMB = (64, 36)


def _pictures_in(img) -> int:  # noqa: ANN001 - a PIL image
    """How many pictures an animation (GIF, WebP, APNG) or a TIFF holds; 1 for anything else: a
    camera's JPEG may carry its preview as a second picture (MPO), which is the same photo."""
    return int(getattr(img, "n_frames", 1)) if img.format in ("GIF", "WEBP", "PNG", "TIFF") else 1


def seen_before(thumb: np.ndarray, thumbs: list[np.ndarray]) -> bool:
    """Whether a picture's thumbnail (grey, THUMB) is one of `thumbs` again; if not, it joins them."""
    if any(float(np.abs(thumb - seen).mean()) < SAME_PICTURE for seen in thumbs):
        return True
    thumbs.append(thumb)
    return False


def _on_white(img):  # noqa: ANN001, ANN202 - PIL images
    """The picture as RGB, a transparent one laid on white (as a chat shows it)."""
    from PIL import Image

    if img.mode in ("RGBA", "LA", "P", "PA"):
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, "white")
        img = Image.alpha_composite(background, img)
    return img.convert("RGB")


def _thumb(img) -> np.ndarray:  # noqa: ANN001 - a PIL image
    return np.asarray(img.convert("L").resize(THUMB), dtype=float)


def eight_bit(img):  # noqa: ANN001, ANN202 - PIL images
    """A 16-bit or 32-bit grey image (a scanner's) as 8-bit grey; any other image as it is.
    Pillow converts by clipping at 255, which turns every grey of 16 bits white and leaves OCR
    nothing to read."""
    from PIL import Image

    if not (img.mode.startswith("I") or img.mode == "F"):
        return img
    grey = np.asarray(img, dtype=np.float64)
    top = float(grey.max()) if grey.size else 0.0
    # The scale its values are on: 0-1 for floats that stay there, 16 bits for I;16 and for
    # any value past 255, else 8 bits.
    if img.mode == "F" and top <= 1.0:
        full = 1.0
    elif img.mode.startswith("I;16") or top > 255:
        full = 65535.0
    else:
        full = 255.0
    return Image.fromarray(np.clip(grey * (255.0 / full), 0, 255).astype(np.uint8), mode="L")


def _upright(img) -> None:  # noqa: ANN001 - a PIL image
    """Turn a photo the way it is shown. A phone stores what its sensor saw and says in EXIF
    (Orientation) how to turn it; read as stored, a receipt shot upright lies on its side, and
    OCR makes nothing of sideways text."""
    from PIL import ImageOps

    try:
        ImageOps.exif_transpose(img, in_place=True)
    except Exception:  # noqa: BLE001 - broken EXIF is not a broken image: read it as stored
        pass


class RapidOcr:
    """rapidocr, built on first use (loading its models takes a second) and shared by threads."""

    def __init__(self, images: PillowImageReader, max_side: int, threads: int = 1):
        self.images = images
        self.max_side = max_side
        self.threads = threads
        self._engine = None
        self._lock = threading.Lock()

    @property
    def engine(self):  # noqa: ANN201
        with self._lock:
            if self._engine is None:
                logging.getLogger("RapidOCR").setLevel(logging.WARNING)
                from rapidocr import RapidOCR

                # Scale down to max_side (the default scales small images *up* to 736 on their
                # short side, which makes OCR of a wide screenshot several times slower).
                self._engine = RapidOCR(
                    params={
                        "Global.log_level": "warning",
                        "Global.use_cls": False,
                        "Det.limit_type": "max",
                        "Det.limit_side_len": self.max_side,
                        "EngineConfig.onnxruntime.intra_op_num_threads": self.threads,
                        "EngineConfig.onnxruntime.inter_op_num_threads": 1,
                    }
                )
                logging.getLogger("RapidOCR").setLevel(logging.WARNING)
            return self._engine

    def read(self, data: bytes) -> list[tuple[str, float]]:
        rgb = self.images.rgb(data)
        result = self.engine(rgb[:, :, ::-1].copy())  # rapidocr expects OpenCV's BGR order
        texts = result.txts or ()
        scores = result.scores or ()
        return [(str(t), float(s)) for t, s in zip(texts, scores, strict=False)]
