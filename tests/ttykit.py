"""Running the real ``farm`` command on a pseudo-terminal, as a person at a terminal would:
stdin, stdout and stderr are all the pty, so ``isatty()`` is true for each."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable

from tests.conftest import ROOT

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Tty:
    """``farm ARGS`` on a fresh pty; ``expect`` reads until a text appears, ``send`` types."""

    def __init__(self, env: dict[str, str], *args: str, columns: int = 200) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "scripts", *args],
                                     env={**env, "COLUMNS": str(columns), "TERM": "xterm"},
                                     cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True)
        os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        """Everything printed so far, as text with ``\\r\\n`` made ``\\n``."""
        return self.raw.decode("utf-8", "replace").replace("\r\n", "\n")

    @property
    def plain(self) -> str:
        """``text`` without terminal escape sequences."""
        return ANSI.sub("", self.text)

    def _read(self, timeout: float) -> bool:
        """Read what is there within ``timeout``; whether anything was read."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every holder of the slave side closed it
            return False
        self.raw += data
        return bool(data)

    def expect(self, what: str | Callable[[str], bool], timeout: float = 60) -> str:
        """Read until ``what`` is in the plain output (or ``what(plain)``); returns it."""
        found = what if callable(what) else (lambda s: what in s)
        deadline = time.monotonic() + timeout
        while not found(self.plain):
            if time.monotonic() > deadline or (not self._read(0.2) and self.proc.poll()
                                               is not None and not found(self.plain)):
                raise AssertionError(f"never saw {what!r} in:\n{self.plain[-3000:]}")
        return self.plain

    def send(self, text: str) -> None:
        """Type ``text`` (add ``\\n`` for Enter)."""
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 120) -> int:
        """Read to the end and return the exit code."""
        deadline = time.monotonic() + timeout
        while self._read(0.2) or self.proc.poll() is None:  # until exited and drained
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"still running after {timeout}s:\n{self.plain[-3000:]}")
        os.close(self.master)
        return self.proc.wait()


def in_tty(env: dict[str, str], *args: str, answer: str | None = None,
           timeout: float = 120) -> tuple[int, str]:
    """Run ``farm ARGS`` on a pty to the end (typing ``answer`` at once if given); returns the
    exit code and the plain output."""
    tty = Tty(env, *args)
    if answer is not None:
        tty.send(answer)
    code = tty.wait(timeout)
    return code, tty.plain
