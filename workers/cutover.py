"""``farm cutover``: freeze the legacy server (optionally), wait until ``farm sync`` has
applied everything it logged, verify the target, and give one verdict.

``--freeze`` sets the legacy server ``read_only`` (``SET GLOBAL``) so its final binlog
position stops moving for the application's (non-admin) writers; on any failure or
interrupt the previous value is restored. A passing cut-over leaves it read-only: the
application is switched to the target next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from jobs import runs
from jobs.runtime import Runtime
from loaders.migration import binlog, runwatch
from loaders.migration.legacy import LegacyReader
from shardfarm.errors import RetryableError
from workers import launch

POLL_SECONDS = 0.5
LEADERLESS_SECONDS = 5.0  # no sync leader this long: the wait says so


class SyncBehindError(RetryableError):
    """Sync did not apply up to the final position in time (is ``farm sync`` running?)."""


@dataclass(frozen=True)
class Verdict:
    """How a cut-over ended."""

    ok: bool
    position: str
    mismatches: int
    verify_run: str
    frozen: bool
    failed_chunks: int = 0

    def line(self) -> str:
        """The one verdict line."""
        word = "exact" if self.ok else "NOT exact"
        failed = (f", {self.failed_chunks} verify chunk(s) failed: 'farm failed --run "
                  f"{self.verify_run}'" if self.failed_chunks else "")
        return (f"cutover: target {word} at legacy binlog position {self.position or '(empty)'}: "
                f"{self.mismatches} mismatch(es){failed} (verify run {self.verify_run})"
                + ("; legacy server left read-only" if self.ok and self.frozen else
                   "; legacy server writable again" if self.frozen else ""))


def cutover(rt: Runtime, freeze: bool, timeout: float,
            notice: Callable[[str], None] = lambda _: None) -> Verdict:
    """Freeze (if asked), wait for sync, verify; restore the server unless exact."""
    reader = LegacyReader(rt.settings.legacy_dsn)
    try:
        binlog.check_server(reader)
        was = _read_only(reader)
        if freeze:
            reader.query("SET GLOBAL read_only = 1")
            notice("legacy server set read-only")
        try:
            verdict = _verified(rt, reader, freeze, timeout, notice)
        except BaseException:
            if freeze:
                reader.query("SET GLOBAL read_only = %s", (was,))
            raise
        if freeze and not verdict.ok:
            reader.query("SET GLOBAL read_only = %s", (was,))
        return verdict
    finally:
        reader.close()


def _read_only(reader: LegacyReader) -> int:
    return int(reader.query("SELECT @@GLOBAL.read_only")[0][0])


def _verified(rt: Runtime, reader: LegacyReader, freeze: bool, timeout: float,
              notice: Callable[[str], None]) -> Verdict:
    final = binlog.current_position(reader)
    notice(f"waiting for sync to apply up to {final or '(empty)'}")
    deadline = time.monotonic() + timeout
    leaderless = NoLeader(timeout, notice)
    while True:
        state = rt.ledger.sync_state.read() or {}
        gtid = state.get("gtid") and binlog.stored(
            state["gtid"], "the control database's sync_state.gtid")
        if gtid and binlog.behind(gtid, final) == 0 \
                and runwatch.activity(rt.ledger).blocker(state.get("run_id")) is None:
            break  # applied up to the end, following the latest migration, which has ended
        leaderless.see(bool(state.get("leading")))
        if time.monotonic() > deadline:
            raise SyncBehindError(f"sync has not applied up to {final} after {timeout:.0f} s "
                                  f"({_why_behind(rt, state)}); nothing was cut over")
        time.sleep(POLL_SECONDS)
    vid, of_run = launch.verify(rt, None, notice)
    outcome = launch.verify_outcome(rt, vid, of_run, runs.wait(rt, vid))
    return Verdict(outcome.ok, final, int(outcome.summary["mismatches"]), vid, freeze,
                   int(outcome.summary["failed_chunks"] or 0))


def _why_behind(rt: Runtime, state: dict) -> str:
    """What keeps sync behind, as far as the control database tells."""
    waiting = runwatch.waiting_for(rt.ledger, state.get("run_id"))
    if waiting:
        return f"it waits for {waiting}"
    return "is 'farm sync' running?" if state.get("leading") else NO_LEADER


NO_LEADER = "no 'farm sync' holds sync's lease: none is running"


class NoLeader:
    """Says once (``notice``) that no ``farm sync`` holds the lease, when none has for
    ``LEADERLESS_SECONDS`` of the wait: the wait cannot end until one runs."""

    def __init__(self, timeout: float, notice: Callable[[str], None]) -> None:
        self.timeout, self.notice = timeout, notice
        self.since: float | None = None
        self.said = False

    def see(self, leading: bool) -> None:
        """One poll's look at the lease."""
        now = time.monotonic()
        if leading:
            self.since = None
            return
        self.since = now if self.since is None else self.since
        if not self.said and now - self.since >= LEADERLESS_SECONDS:
            self.notice(f"{NO_LEADER}: start 'farm sync' (cutover waits up to "
                        f"{self.timeout:.0f} s for it to apply the rest)")
            self.said = True
