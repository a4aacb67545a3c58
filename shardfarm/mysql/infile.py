"""The temp files ``LOAD DATA LOCAL INFILE`` reads: where they live, writing one, sweeping.

A bulk writer puts its rows in a ``farm-*.tsv`` file under ``TMP`` (``/dev/shm`` when the
machine has it, else the system temp directory), loads it, and deletes it. A worker
killed during the load leaves its file behind; ``sweep_temp`` (run by the supervisor)
deletes such files once no load can still be reading them.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
PREFIX, SUFFIX = "farm-", ".tsv"


@contextmanager
def temp_tsv(text: str) -> Iterator[str]:
    """A ``farm-*.tsv`` file under ``TMP`` holding ``text`` (UTF-8): its path, for the
    ``with`` block's time; deleted afterwards."""
    fd, path = tempfile.mkstemp(prefix=PREFIX, suffix=SUFFIX, dir=TMP)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        yield path
    finally:
        os.unlink(path)


def sweep_temp(max_age: float = 3600) -> int:
    """Delete ``farm-*.tsv`` files older than ``max_age`` seconds: left by a worker killed
    during a ``LOAD DATA`` (no load lasts that long). Returns how many were deleted."""
    root = Path(TMP or tempfile.gettempdir())
    cutoff, n = time.time() - max_age, 0
    for path in root.glob(f"{PREFIX}*{SUFFIX}"):
        with suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
                n += 1
    return n
