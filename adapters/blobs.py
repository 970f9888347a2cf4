"""The blob store: attachment bytes in a local folder, named by their sha256, written once."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


class LocalBlobStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, sha256: str) -> Path:
        # Two levels of fan-out keep folders small at millions of files.
        return self.root / sha256[:2] / sha256[2:4] / sha256

    def put(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        target = self.path(sha)
        if target.exists():
            return sha
        target.parent.mkdir(parents=True, exist_ok=True)
        # Write aside, then rename: a reader never sees half a file, two writers race harmlessly.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return sha

    def get(self, sha256: str) -> bytes:
        return self.path(sha256).read_bytes()

    def delete(self, sha256: str) -> bool:
        """Remove a blob (erasure); False when it was not there."""
        try:
            self.path(sha256).unlink()
        except FileNotFoundError:
            return False
        return True
