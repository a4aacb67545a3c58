"""The temp files ``LOAD DATA LOCAL INFILE`` reads: where they live, writing one, sweeping.

A bulk writer puts its rows in a ``farm-PID-*.tsv`` file under ``TMP`` (``/dev/shm`` when
the machine has it, else the system temp directory), loads it, and deletes it. A worker
killed during the load leaves its file behind; ``sweep_temp`` (run by the supervisor at
start and with its housekeeping) deletes such files once their process has ended.
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
def temp_tsv(text: str | bytes) -> Iterator[str]:
    """A ``farm-PID-*.tsv`` file under ``TMP`` holding ``text`` (UTF-8, or bytes as they
    are): its path, for the ``with`` block's time; deleted afterwards. The PID names the
    process that may still be loading it."""
    fd, path = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", suffix=SUFFIX, dir=TMP)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
        yield path
    finally:
        os.unlink(path)


def _writer_gone(name: str) -> bool:
    """Whether the process named in a ``farm-PID-*.tsv`` name has ended (``False`` for a
    name without a PID, or a process of another user that still runs)."""
    pid = name[len(PREFIX):].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def sweep_temp(max_age: float = 3600) -> int:
    """Delete ``farm-*.tsv`` files left by a worker killed during a ``LOAD DATA``: those whose
    process has ended, and any older than ``max_age`` seconds (no load lasts that long; a
    PID may have been reused). Returns how many were deleted."""
    root = Path(TMP or tempfile.gettempdir())
    cutoff, n = time.time() - max_age, 0
    for path in root.glob(f"{PREFIX}*{SUFFIX}"):
        with suppress(OSError):
            if _writer_gone(path.name) or path.stat().st_mtime < cutoff:
                path.unlink()
                n += 1
    return n
