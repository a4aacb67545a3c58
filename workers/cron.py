"""The nightly scheduler (``farm cron``, the Procfile's ``clock``): enqueue the export of the
previous UTC day at each slot of a cron expression (default ``0 3 * * *``).

Any number may run; one acts. Each holds for a leader lease in Redis
(``SET NX PX``, renewed every tick); only the leader looks at the schedule.
What fired is durable in the control database, not Redis: ``cron_state`` keeps
the last slot per entry, and each slot's run has a deterministic run ID
(``cron-export-20261122T0300Z``), so even two schedulers that both believe
they lead (a lease lost in a pause, a Redis that restarted empty) create one
run per slot: the second insert of the same run ID is refused by its primary key.

Catch-up: every slot missed since the last one fired (while no scheduler ran)
fires when a scheduler starts, oldest first, at most ``CATCH_UP`` of them (the
most recent). A first start with no state fires only the most recent slot.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

import redis
from croniter import croniter
from pymysql.constants import ER

from exporters import export as exporter
from farmcore import keys
from farmcore.cronstate import EPOCH, CronState
from jobs.dispatch import dispatch
from jobs.runs import DEFAULT_QUEUE, resume
from jobs.runtime import Runtime
from shardfarm import tuning
from shardfarm.bounds import redis_error_line
from shardfarm.errors import ConfigError, DatabaseError, RetryableError, UsageError, first_line
from workers.maintenance import CLEAR_FORGED

log = logging.getLogger(__name__)
DEFAULT_AT = tuning.DEFAULT_EXPORT_CRON
TICK_SECONDS = 5.0
LEASE_SECONDS = 15.0
LEASE_CAP_SECONDS = 60.0  # no scheduler's lease is longer: a key that lives longer is none
CATCH_UP = 7
# KEYS[1]: the lease; ARGV: owner, milliseconds, the cap in milliseconds. Takes the lease or
# renews ours. A key there that is not a lease (another type, a value with no expiry, or one
# that lives longer than any scheduler's lease: ``CLEAR_FORGED``) is taken over, or no
# scheduler would lead again (for good, or until a forged expiry a year away).
_LEAD = CLEAR_FORGED.decode() + """
clear_forged(KEYS[1], tonumber(ARGV[3]))
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = ("if redis.call('type', KEYS[1]).ok == 'string' and redis.call('get', KEYS[1]) "
            "== ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end")


class RoundFailedError(RetryableError):
    """``farm cron --once``: its round failed for a reason a later round may not meet (the
    message names the slot and the cause); run it again."""


def check_expression(expr: str) -> str:
    """A 5-field cron expression (minute hour day month weekday, UTC) given as ``--at``, or
    one clear line (``UsageError``); checked by ``shardfarm.tuning`` like FARM_EXPORT_CRON."""
    return str(tuning.value("FARM_EXPORT_CRON", given=expr, flag="--at"))


def check_name(name: str, flag: str | None = None) -> str:
    """A schedule entry's name (letters, digits, '-'; 20 at most: it is part of run IDs
    and keys), or one line: a ``UsageError`` naming ``flag`` when given, else a
    ``ConfigError``."""
    if name.replace("-", "").isascii() and name.replace("-", "").isalnum() and len(name) <= 20:
        return name
    error = UsageError if flag else ConfigError
    raise error(f"bad {flag or 'cron entry name'} {name[:40]!r} (letters, digits, '-'; "
                "20 at most)")


def utcnow() -> dt.datetime:
    """Now in UTC, naive (the control database's DATETIME columns are UTC)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def slots_between(expr: str, after: dt.datetime | None, now: dt.datetime,
                  limit: int = CATCH_UP) -> list[dt.datetime]:
    """Slots in ``(after, now]``, oldest first, at most the ``limit`` most recent.

    With ``after`` unknown (``None``) only the most recent slot is due.
    """
    it = croniter(expr, now + dt.timedelta(seconds=1))  # get_prev is strictly before its start
    out: list[dt.datetime] = []
    while len(out) < (1 if after is None else limit):
        slot = it.get_prev(dt.datetime)
        if after is not None and slot <= after:
            break
        out.append(slot)
    return out[::-1]


def run_id_for(name: str, slot: dt.datetime) -> str:
    """The one run ID a slot can ever have: ``cron-export-20261122T0300Z``."""
    return f"cron-{name}-{slot:%Y%m%dT%H%M}Z"


class Scheduler:
    """One cron entry that starts an export run per slot, acting only while it leads."""

    def __init__(self, rt: Runtime, *, name: str = "export", at: str = DEFAULT_AT,
                 export_args: dict | None = None,
                 now: Callable[[], dt.datetime] = utcnow, owner: str | None = None,
                 lease_seconds: float = LEASE_SECONDS, catch_up: int = CATCH_UP) -> None:
        self.rt, self.name, self.at = rt, check_name(name), check_expression(at)
        self.export_args = dict(export_args or {})
        self.now, self.catch_up = now, catch_up
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        if not 0 < lease_seconds <= LEASE_CAP_SECONDS:
            raise ConfigError(f"a cron lease of {lease_seconds:g} s is out of range "
                              f"(0, {LEASE_CAP_SECONDS:g}]")
        self.lease_ms = int(lease_seconds * 1000)
        self.key = keys.leader(f"cron:{name}")

    # -- leadership ---------------------------------------------------------------------
    def lead(self) -> bool:
        """Take the leader lease, or renew it if it is ours; whether we lead now."""
        return bool(self.rt.redis.eval(_LEAD, 1, self.key, self.owner, self.lease_ms,
                                       int(LEASE_CAP_SECONDS * 1000)))

    def resign(self) -> None:
        """Give the lease up if it is ours (on shutdown), so another takes over at once."""
        self.rt.redis.eval(_RELEASE, 1, self.key, self.owner)

    # -- durable state ------------------------------------------------------------------
    @property
    def state(self) -> CronState:
        """The durable record of fired slots (the control database's ``cron_state``)."""
        return self.rt.ledger.cron_state

    def last_slot(self) -> dt.datetime | None:
        """The last slot fired, or ``None`` before the first."""
        return self.state.last_slot(self.name)

    # -- firing -------------------------------------------------------------------------
    def due(self) -> list[dt.datetime]:
        """Slots not fired yet, oldest first (see the module's catch-up rule)."""
        return slots_between(self.at, self.last_slot(), self.now(), self.catch_up)

    def fire(self, slot: dt.datetime) -> dict:
        """Start the export of the day before ``slot`` (once per slot, whoever asks)."""
        date = (slot.date() - dt.timedelta(days=1)).isoformat()
        a = self.export_args
        params, chunks = exporter.plan(self.rt.router, date, a.get("dest") or
                                     self.rt.settings.export_url, a.get("tables"),
                                     a.get("format", "jsonl"), a.get("from", "master"))
        run_id = run_id_for(self.name, slot)
        params = {**params, "handler": exporter.HANDLER, "cron": self.name,
                  "slot": slot.isoformat() + "Z"}
        try:
            self.rt.ledger.create_run("export", DEFAULT_QUEUE, params, chunks, run_id=run_id)
            created = True
        except DatabaseError as exc:
            if exc.code != ER.DUP_ENTRY:  # not "that run exists already"
                raise
            created = False
        if created:
            run = self.rt.ledger.run(run_id)
            dispatch(self.rt.redis, run, range(run["total_chunks"]))
        elif (self.last_slot() or EPOCH) < slot:
            # created, but its creator died before recording the slot: it may never have
            # been queued. (A rival that fired it records the slot right after queueing.)
            resume(self.rt, run_id)
        self.state.advance(self.name, slot, run_id)
        log.info("cron %s: slot %s -> export of %s (%s, run %s)", self.name, slot, date,
                 "started" if created else "already started", run_id)
        return {"cron": self.name, "slot": slot.isoformat() + "Z", "date": date,
                "run_id": run_id, "created": created}

    def tick(self) -> list[dict]:
        """One round: if leading, fire every due slot; returns what fired."""
        if not self.lead():
            return []
        return [self.fire(slot) for slot in self.due()]

    def once(self) -> dict:
        """One round, then give the lease up: ``{"cron", "leader", "fired"}``.

        A failed round is one line naming the slot and the cause: a ``ConfigError`` as
        ``run`` ends with, any other error a ``RoundFailedError`` (``farm cron`` exits 1).
        """
        fired: list[dict] = []
        try:
            leader = self._round(fired.append, None)
        finally:
            self._resign()
        return {"cron": self.name, "leader": leader, "fired": fired}

    def run(self, stop: threading.Event, on_fire: Callable[[dict], None] | None = None,
            every: float = TICK_SECONDS) -> None:
        """Tick every ``every`` seconds until ``stop`` is set (the lease given up at the end).

        A failed round is one error line naming the slot and run it was firing (the
        traceback at DEBUG), and the next tick tries again; a ``ConfigError``, which every
        round would meet again until an operator acts, ends the loop as a ``ConfigError``
        in one line (``farm cron`` exits 1).
        """
        try:
            while not stop.is_set():
                self._round(on_fire, every)
                stop.wait(every)
        finally:
            self._resign()

    def _resign(self) -> None:
        """``resign``, or a warning: the lease expires by itself (and an error here must not
        hide the one that ended the round)."""
        try:
            self.resign()
        except Exception:  # noqa: BLE001 - the lease expires by itself
            log.warning("cron %s: could not resign the lease", self.name)

    def _round(self, on_fire: Callable[[dict], None] | None, every: float | None) -> bool:
        """One ``tick``, saying what failed in one line; whether it led and fired what was
        due. With ``every`` (``run``) an error other than a ``ConfigError`` is logged and the
        round returns; without (``once``: no next tick) it is a ``RoundFailedError``."""
        doing = "taking the leader lease"
        try:
            if not self.lead():
                return False
            doing = "reading the schedule"
            for slot in self.due():
                doing = f"slot {slot.isoformat()}Z (run {run_id_for(self.name, slot)})"
                fired = self.fire(slot)
                if on_fire:
                    on_fire(fired)
            return True
        except ConfigError as exc:  # UsageError too: a bad value read at a slot, exit 1
            raise ConfigError(f"cron {self.name}: {doing} failed: {first_line(exc)}; fix "
                              "it and start farm cron again") from exc
        except Exception as exc:  # the scheduler lives on: tried again next tick
            if every is None:
                raise RoundFailedError(f"cron {self.name}: {doing} failed: {_cause(exc)}; "
                                       "run farm cron --once again") from exc
            log.error("cron %s: %s failed: %s; trying again in %ss", self.name, doing,
                      _cause(exc), every)
            log.debug("cron %s: %s failed", self.name, doing, exc_info=True)
            return False


def _cause(exc: Exception) -> str:
    """One line for why a round failed: the error's class and first line (a Redis error
    with what to check)."""
    if isinstance(exc, redis.RedisError):
        return redis_error_line(exc)
    return f"{type(exc).__name__}: {first_line(exc)}"
