"""The data folder holds conversations: the embedded Redis's append-only file (events before
ingest, in clear), mem0's history, attachment bytes, the publish spool, the key file. It is made
for its user alone (0700), and one that other users may enter is closed to them at start. Its
group keeps what it has: a deployment may share the folder with a group on purpose."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def private(folder: Path) -> None:
    """Create `folder` for this user alone, or take other users' rights from an existing one of ours.
    Never fails: a process that writes nothing there (a read-only image, external services) still
    starts, and whatever does write there meets the file system's own error."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
        if st.st_mode & 0o007 and st.st_uid == os.geteuid():
            folder.chmod(stat.S_IMODE(st.st_mode) & ~0o007)
            log.info("closed the data folder %s to other users: it holds conversations", folder)
    except OSError as error:
        log.warning("could not make the data folder %s private: %s", folder, error)
