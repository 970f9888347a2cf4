"""The one permanent failure of an attachment: the file itself is bad."""

from __future__ import annotations


class BadFile(Exception):
    """A permanent problem with the file itself; `reason` says what, for people."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
