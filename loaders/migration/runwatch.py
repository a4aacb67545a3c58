"""What the migrate runs are doing, as ``farm sync`` and ``farm cutover`` need to know it.

Sync applies changes only while no migration writes: a chunk and an apply that overlap
may each write an older copy of a row over the other's newer one. A migration writes
while its latest run has chunks to run, and while any migrate run (an older one
re-opened by ``farm retry-failed``, say) has a chunk leased. An older run left
unfinished with nobody working on it writes nothing and holds nothing up. A chunk whose
lease expired counts for ``GRACE`` more seconds, and so does a claim made just before
the time asked about.
"""

from __future__ import annotations

from dataclasses import dataclass

from farmcore.ledger import Ledger
from farmcore.runstate import fell_short

KIND = "migrate"
# Seconds a chunk still counts as at work after its lease expired (a statement already
# sent may run on: a lock wait lasts up to innodb_lock_wait_timeout, 50 s by default), and
# before the time asked about for a claim (its statement may commit a little later).
GRACE = 120.0


@dataclass(frozen=True)
class Activity:
    """The migrate runs at one moment of the control database's clock."""

    latest: str | None  # the newest migrate run
    latest_open: bool  # it has chunks pending or running
    active: list[str]  # runs with a chunk leased (or claimed since the time asked about)
    at: object  # the control database's time when this was read

    @property
    def busy(self) -> str | None:
        """A run a migration writes for: the latest while it has chunks to run, else one
        with a chunk at work; ``None`` when no migration writes."""
        if self.latest_open:
            return self.latest
        return self.active[0] if self.active else None

    def blocker(self, followed: str | None) -> str | None:
        """The run to wait for before following ``followed`` (or applying for it);
        ``None`` when ``followed`` is the latest run, ended, and no migration writes."""
        if self.latest is not None and self.latest != followed:
            return self.latest
        return self.busy


def activity(ledger: Ledger, since: object = None) -> Activity:
    """The migrate runs now; with ``since`` (an earlier ``Activity.at``), a run with a
    chunk claimed after it counts as active (it may have written meanwhile)."""
    active, at = ledger.active_runs(KIND, since, GRACE)
    latest = ledger.latest_run(KIND)
    return Activity(latest, bool(latest and ledger.unfinished(latest, limit=1)), active, at)


def waiting_for(ledger: Ledger, followed: str | None) -> str | None:
    """The migrate run sync waits for instead of following ``followed``, and why (one
    phrase for status lines); ``None`` if it waits for none."""
    act = activity(ledger)
    if act.latest is None:
        return None
    busy = act.busy
    if busy is not None:
        return f"migrate run {busy} ({'paused' if ledger.run(busy)['paused'] else 'running'})"
    if fell_short(status := ledger.run(act.latest)["status"]):  # failed or cancelled
        return (f"migrate run {act.latest} ({status}: 'farm retry-failed --run {act.latest}' "
                "or a new 'farm migrate')")
    return f"migrate run {act.latest} (done, not followed yet)" \
        if act.latest != followed else None
