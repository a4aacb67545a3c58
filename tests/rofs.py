"""A directory made read-only by the kernel, for tests of export destinations.

The tests run as root, whom file permissions do not stop; a read-only bind mount does.
``read_only(path)`` bind-mounts ``path`` onto itself read-only and unmounts it after. A
machine that cannot mount fails the test with the reason (never skips it): the check
under test would otherwise go untested without anyone noticing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` (a directory) read-only for everyone, root included, until the block ends."""
    path.mkdir(parents=True, exist_ok=True)
    done = _mount("--bind", "-o", "ro", str(path), str(path))
    if done.returncode != 0:
        pytest.fail(f"this test needs a read-only bind mount ('mount --bind -o ro'), and "
                    f"mounting failed: {done.stderr.strip() or done.returncode} (run the "
                    "tests as root with CAP_SYS_ADMIN)")
    try:
        remount = _mount("-o", "remount,bind,ro", str(path))  # older kernels ignore -o ro
        probe = path / ".rw-probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.fail(f"{path} is still writable after a read-only bind mount "
                        f"({remount.stderr.strip()})")
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
