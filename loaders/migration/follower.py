"""``farm sync``: follow the legacy binlog and apply every change, one leader at a time.

Any number of processes may run; the one holding the lease in the control database
(``farmcore.syncstate``) leads, the others wait to take over when it expires. The
leader follows the latest ``farm migrate`` run once it has ended without a failed
chunk, from the position that run recorded when it was planned (or the checkpoint of an
earlier leader of the same run). A migration at work while it follows (``runwatch``)
makes it stop before its next apply and wait: a chunk and an apply that overlap may
each write an older copy of a row over the other's newer one. Then the leader follows
the latest run from its own position (every change after it is applied again, after
the chunks wrote); an apply a chunk may have overlapped, or that its leader never
recorded, is applied again from where it began. It gathers row changes of whole
transactions, applies them (``loaders.migration.sync``, fenced with the lease's token)
and only then moves the checkpoint to the end of the last transaction applied: killed
at any point, the next leader starts from a position whose every earlier change is
applied, and applies again at most what came after it (harmless: applying is
idempotent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from farmcore.ledger import Ledger
from farmcore.runstate import CANCELLED, fell_short
from loaders.migration import binlog, runwatch, sync
from loaders.migration.feed import Feed
from loaders.migration.legacy import LegacyReader
from shardfarm.errors import ConfigError, FarmError, FencedError
from shardfarm.mysql.dsn import DSN
from shardfarm.settings import Settings
from sharding.fencing import FenceToken
from sharding.router import Router

log = logging.getLogger(__name__)
LEASE_SECONDS = 10.0
# Legacy keys per apply, at most. A batch is only as large as what was read ahead while the
# last one applied (a few hundred keys when following a live load); a backlog fills it.
# Most statements of an apply go to every shard or bucket touched, whatever the batch's
# size, so larger batches cost less per key: a 60k-change backlog applied at 6.4k changes/s
# with 5,000, 8.6k with 20,000, 10-11k with 50,000 (the sync process's peak RSS 125 MB).
BATCH_ROWS = 50_000


@dataclass
class Follower:
    """One ``farm sync`` process."""

    settings: Settings
    router: Router
    ledger: Ledger
    owner: str
    host: str
    until_caught_up: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Lead when possible and follow until stopped (or caught up, if asked)."""
        reader = LegacyReader(self.settings.legacy_dsn)
        readers = sync.Readers(self.settings.legacy_dsn)
        try:
            binlog.check_server(reader)
            while not self.stop.is_set():
                fence = self.ledger.sync_state.acquire(self.owner, self.host, LEASE_SECONDS)
                if fence is None:
                    self.stop.wait(LEASE_SECONDS / 4)
                elif self._lead(reader, readers, fence):
                    return
        finally:
            reader.close()
            readers.close()

    def _lead(self, reader: LegacyReader, readers: sync.Readers, fence: int) -> bool:
        """Follow the run to follow under lease ``fence``; True when done (caught up, or
        stopped). A refusal (no run to follow, a failed one) gives the lease back at once,
        so that 'farm sync status' shows no leader and the next sync need not wait."""
        try:
            run = self._run()
            if run is None:
                self.stop.wait(1.0)
                return False
            if self._follow(reader, readers, fence, run):
                self.ledger.sync_state.release(fence)
                return True
        except FencedError as exc:  # another process took over: wait to lead again
            log.warning("%s; waiting to lead again", exc)
        except BaseException:
            with suppress(FarmError):
                self.ledger.sync_state.release(fence)
            raise
        return False

    def _run(self) -> dict | None:
        """The migrate run to follow: the latest, once it has ended and no migration writes
        (``runwatch``); ``None`` meanwhile."""
        act = runwatch.activity(self.ledger)
        if act.latest is None:
            raise ConfigError("no migrate run to follow: run 'farm migrate' first")
        run_id = act.latest
        run = self.ledger.run(run_id)
        if run["params"].get("binlog_pos") is None:
            raise ConfigError(f"migrate run {run_id} recorded no binlog position (the legacy "
                              "server had no binary log then): run 'farm migrate' again")
        binlog.stored(run["params"]["binlog_pos"], f"migrate run {run_id}'s binlog_pos")
        if act.busy is not None:
            return None
        if fell_short(run["status"]):
            raise ConfigError(_not_followed(run_id, run["status"]))
        return run

    def _start(self, run: dict) -> tuple[str, bool]:
        """Where to follow ``run`` from, and whether that is an earlier leader's unrecorded
        apply: the checkpoint if it is of ``run``; else the run's own position, or where
        an apply began that a leader never recorded (it died or lost its lease inside it)
        if that is earlier: the apply may have overlapped this run's chunks."""
        state = self.ledger.sync_state.read()
        for col in ("gtid", "applying_from", "applying_to"):  # anyone may write them
            if state.get(col) is not None:
                binlog.stored(state[col], f"the control database's sync_state.{col}")
        gtid, own, began = state.get("gtid"), run["params"]["binlog_pos"], state.get(
            "applying_from")
        if gtid is not None and state.get("run_id") == run["run_id"]:
            return gtid, False
        if began is not None and binlog.behind(began, own) > 0:
            return began, True
        return own, False

    def _follow(self, reader: LegacyReader, readers: sync.Readers, fence: int, run: dict
                ) -> bool:
        """Stream and apply until stopped, caught up (if asked) or the lease is lost: each
        batch is every whole transaction read ahead while the last one applied (at most
        ``BATCH_ROWS`` keys), so a busy server gets larger batches, never a wait. False
        when ``run`` is no longer the one to follow (checked before and after every
        apply): the caller waits for the migration to end."""
        token = FenceToken("sync", 0, fence)
        upto, anew = self._start(run)  # every change before it is applied
        if anew and not self.ledger.sync_state.checkpoint(
                fence, run["run_id"], upto, self.ledger.sync_state.read().get("event_time") or 0,
                {}, anew=True):
            raise FencedError(f"sync lease {fence} lost before its checkpoint")
        feed = Feed(self.settings.legacy_dsn, upto)
        try:
            while not self.stop.is_set():
                changes = sync.Changes()
                target = binlog.current_position(reader) if self.until_caught_up else None
                mark = feed.take(changes, BATCH_ROWS)
                act = runwatch.activity(self.ledger)
                blocker = act.blocker(run["run_id"])
                if blocker is not None:
                    log.info("migrate run %s is at work or new: sync waits until no "
                             "migration writes", blocker)
                    return False
                if not self._flush(readers, fence, token, run, changes, mark, upto, act.at):
                    return False
                upto = mark.position
                if target is not None and binlog.behind(upto, target) == 0:
                    return True  # everything logged before this batch was read is applied
            return True
        finally:
            feed.close()

    def _flush(self, readers: sync.Readers, fence: int, token: FenceToken, run: dict,
               changes: sync.Changes, mark: binlog.Mark, upto: str, since: object) -> bool:
        """Apply ``changes``, then checkpoint ``mark`` (fenced at both ends). False, and no
        checkpoint, if a migration started or was re-opened meanwhile: its chunks may
        have read a row before this apply read it and written it after, or the other way
        round. Then the next run to follow is recorded with ``upto`` (the position before
        this apply), so the changes of this apply are applied again after that run."""
        held = (self.ledger.sync_state.begin_apply(fence, LEASE_SECONDS, upto, mark.position)
                if changes.rows() else self.ledger.sync_state.renew(fence, LEASE_SECONDS))
        if not held:
            raise FencedError(f"sync lease {fence} lost")
        began = time.monotonic()
        with self._renewing(fence) as lost:
            applied = sync.apply(self.router, token, readers, self.ledger.quarantine, run,
                                 changes)
        if lost.is_set():
            raise FencedError(f"sync lease {fence} lost during an apply")
        act = runwatch.activity(self.ledger, since)  # a chunk claimed since the check
        blocker = act.blocker(run["run_id"])
        if blocker is not None:
            log.info("migrate run %s may have written during this apply: it is not "
                     "recorded, and is applied again once no migration writes", blocker)
            was = self.ledger.sync_state.read().get("event_time") or 0
            if not self.ledger.sync_state.checkpoint(fence, act.latest or run["run_id"], upto,
                                                     was, {}):
                raise FencedError(f"sync lease {fence} lost before its checkpoint")
            return False
        if applied:
            log.info("applied %d legacy keys (%s) in %.2fs, up to %s", sum(applied.values()),
                     ", ".join(f"{t} {n}" for t, n in applied.items()),
                     time.monotonic() - began, mark.position)
        state = self.ledger.sync_state.read()
        if not applied and state.get("gtid") == mark.position \
                and state.get("run_id") == run["run_id"]:
            return True  # nothing new to record (a run followed anew is recorded at once)
        stamp = mark.timestamp or int(time.time())
        past = state.get("applying_to") is not None and binlog.behind(  # an earlier leader's
            mark.position, state["applying_to"]) == 0                   # apply, made again
        if not self.ledger.sync_state.checkpoint(fence, run["run_id"], mark.position, stamp,
                                                 applied, anew=past):
            raise FencedError(f"sync lease {fence} lost before its checkpoint")
        return True

    @contextmanager
    def _renewing(self, fence: int) -> Iterator[threading.Event]:
        """Renew the lease every third of it while the block runs: an apply (a large
        batch, a deleted user's cascade) may last longer than the lease, and a standby
        must not take over a leader that is working. The event is set if it was lost."""
        lost, done = threading.Event(), threading.Event()

        def beat() -> None:
            while not done.wait(LEASE_SECONDS / 3):
                try:
                    if not self.ledger.sync_state.renew(fence, LEASE_SECONDS):
                        lost.set()
                        return
                except FarmError as exc:  # the control database blinked: the lease's
                    log.warning("renewing the sync lease: %s", exc)  # expiry guards
        beater = threading.Thread(target=beat, daemon=True, name="sync-lease")
        beater.start()
        try:
            yield lost
        finally:
            done.set()
            beater.join()


def _not_followed(run_id: str, status: str) -> str:
    """Why sync does not follow a migrate run that ended ``status`` (failed or cancelled),
    and what to run instead."""
    how = ("was cancelled ('farm cancel'): take it up again" if status == CANCELLED else
           f"ended with failed chunks ('farm failed --run {run_id}' says why): retry them")
    return (f"migrate run {run_id} {how} ('farm retry-failed --run {run_id}') or run 'farm "
            "migrate' again, then 'farm sync'")


def status(ledger: Ledger, reader: LegacyReader | None) -> dict:
    """Where sync stands: leader, checkpoint, lag (transactions and seconds, against the
    legacy server's position now when ``reader`` reaches it), keys applied per table,
    the followed run's quarantine by reason, and ``waiting_for`` the migrate run sync
    waits for instead of following (running, failed, or not picked up yet)."""
    state = ledger.sync_state.read()
    if not state:
        return {"state": "never run"}
    out = {"leader": state["owner"] if state["leading"] else None,
           "host": state["host"] if state["leading"] else None, "run_id": state["run_id"],
           "position": state["gtid"], "applied": state["applied"],
           "checkpointed_at": str(state["checkpointed_at"] or "")}
    if reader is not None:
        server = binlog.current_position(reader)
        try:
            lag = binlog.behind(state["gtid"] or "", server)
        except binlog.MalformedPositionError:  # written by anyone: shown, lag unknown
            return out | {"server_position": server} | _waiting_and_quarantine(ledger, state)
        out.update({"server_position": server, "lag_events": lag,
                    "lag_seconds": 0 if lag == 0 or not state["event_time"]
                    else max(0, int(time.time()) - int(state["event_time"]))})
    return out | _waiting_and_quarantine(ledger, state)


def _waiting_and_quarantine(ledger: Ledger, state: dict) -> dict:
    """``waiting_for`` (if sync waits for a migrate run) and the followed run's quarantine
    by reason, of ``status``."""
    out: dict = {}
    waiting = runwatch.waiting_for(ledger, state["run_id"])
    if waiting:
        out["waiting_for"] = waiting
    quarantined: dict[str, dict[str, int]] = {}
    for table, reason, n in ledger.quarantine.reasons(state["run_id"]) if state["run_id"] else []:
        quarantined.setdefault(table, {})[reason] = n
    out["quarantined"] = quarantined
    return out


def view(ledger: Ledger, legacy_dsn: DSN) -> dict | None:
    """``status``, with the lag when the legacy server answers (else without it); ``None``
    before the first sync."""
    if not ledger.sync_state.read():
        return None
    reader = LegacyReader(legacy_dsn, bound=ledger.pool.bound)  # a status view's, if bounded
    try:
        return status(ledger, reader)
    except FarmError:
        return status(ledger, None)
    finally:
        reader.close()
