"""Promoting a slave whose master died (``farm shards promote HOST``).

The slave must have applied everything its master sent: every GTID its I/O thread
received (``Gtid_IO_Pos``) must be in ``gtid_slave_pos`` once the SQL thread has
worked through the relay log (waited for with ``MASTER_GTID_WAIT``); a master that
still answers is made read-only first and its ``gtid_binlog_pos`` must be applied
too. A slave that is behind is refused unless the operator accepts losing the
missing transactions. Then replication is stopped and reset on the slave, it is
made writable, and the next map version names it master of every range its old
master held with it, lists the old master under ``gone``, and keeps the promoted
host as its own slave until a new one is provisioned.

Every step is safe to run twice, so a promote that stopped anywhere is finished by
running it again: the catch-up check passes again (``gtid_slave_pos`` outlives ``RESET
SLAVE ALL``; a live old master stays read-only), stopping and resetting replication
that is already reset changes nothing, and a map that already shows the promotion (the
write landed, its answer did not) is recognised and not written again. The map change
is a compare-and-set on the ranges the promote checked: a map in force that no longer
has the host as the slave of its old master there is not changed. A failure after the
slave was made writable says so in one line, and to run the command again.

A master that answers is recorded (``ReadOnlyRecord``, the caller's durable record) before
it is made read-only, and the record is cleared once the promote is done with it: it
finished, or it was refused and gave the master its writes back. A promote that stopped
in between leaves the record, so the operator learns it from the record, not from a
later refusal; a record that cannot be written refuses the promote, with nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

import pymysql.cursors

from shardfarm.errors import FarmError, FatalError, StaleStateError, UsageError, first_line
from shardfarm.mysql.dsn import Host
from sharding.mappublish import amend
from sharding.router import Router
from sharding.shardmap import ShardMap


@dataclass(frozen=True)
class Promoted:
    """What ``promote`` did."""

    host: str
    old_master: str | None  # None when an earlier run had already changed the map
    version: int
    applied: str
    received: str
    lost: bool
    already: bool = False  # the map already showed the promotion: nothing was written


class ReadOnlyRecord(Protocol):
    """Where a promote records the masters it makes read-only, until it is done with them."""

    def left_read_only(self, master: str, promoting: str, accept_loss: bool) -> None:
        """Record that ``master`` is being made read-only to promote ``promoting``."""

    def settled(self, *, master: str | None = None, promoting: str | None = None) -> None:
        """Forget ``master``'s record, or those every promote of ``promoting`` left."""


class PromoteRecordError(FatalError):
    """The record of a master about to be made read-only could not be written: nothing was
    changed."""


class PromoteIncompleteError(FatalError):
    """The promote stopped after it changed the slave: running it again finishes it."""


class _MapMovedError(StaleStateError):
    """The map in force no longer has the host as the slave of its old master."""


def _positions(pos: str) -> dict[int, int]:
    """``"0-1-42,1-2-7"`` -> ``{domain: seq}``."""
    out = {}
    for part in filter(None, (p.strip() for p in pos.split(","))):
        domain, _, seq = part.split("-")
        out[int(domain)] = int(seq)
    return out


def missing(applied: str, wanted: str) -> list[str]:
    """GTID domains of ``wanted`` that ``applied`` has not reached, as ``domain:have<want``."""
    have = _positions(applied)
    return [f"domain {d}: {have.get(d, 0)} < {seq}" for d, seq in _positions(wanted).items()
            if have.get(d, 0) < seq]


def _pairs(doc: dict) -> list[dict]:
    """Every range entry of a map document: shard ranges, then mod ranges."""
    return [*doc["shards"], *doc["mod"]["ranges"]]


def _held(doc: dict, old: str, host: str) -> list[list[list[int]]]:
    """The shard ranges and the mod ranges ``old`` is master of with ``host`` as its slave."""
    return [sorted(list(e["range"]) for e in entries if (e["master"], e["slave"]) == (old, host))
            for entries in (doc["shards"], doc["mod"]["ranges"])]


def promoted_already(m: ShardMap, host: str) -> bool:
    """Whether the map shows ``host`` promoted: master of ranges it is also the slave of
    (what promote writes, until a new slave is published), slave of no other master."""
    entries = [*m.shard_ranges, *m.mod_ranges]
    return (any(r.master == host == r.slave for r in entries)
            and not any(r.slave == host != r.master for r in entries))


def old_master_of(m: ShardMap, host: str) -> str:
    """The master whose ranges ``host`` is the slave of (``UsageError`` if none or several)."""
    if host not in m.hosts:
        raise UsageError(f"{host[:64]!r} is not a host of the shard map")
    masters = {r.master for r in [*m.shard_ranges, *m.mod_ranges]
               if r.slave == host and r.master != host}
    if len(masters) != 1:
        raise UsageError(f"{host} is the slave of {len(masters)} masters in the map "
                         f"({', '.join(sorted(masters)) or 'none'}); promote needs exactly one")
    return masters.pop()


def _master_pos(router: Router, master: Host, record: Callable[[], None]
                ) -> tuple[str | None, bool]:
    """Make a master that still answers read-only, ``record()`` called just before; its
    binlog position (``None``: dead) and whether it was writable until now
    (``_writable_again`` undoes it on a refusal)."""
    try:
        with router.connection(master) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@read_only")
            was_writable = not int(cur.fetchone()[0])
            record()
            cur.execute("SET GLOBAL read_only = 1")
            cur.execute("SELECT @@gtid_binlog_pos")
            return cur.fetchone()[0], was_writable
    except PromoteRecordError:
        raise
    except FarmError:
        return None, False


def _recorder(journal: ReadOnlyRecord, old: str, host: str, accept_loss: bool
              ) -> Callable[[], None]:
    """``journal.left_read_only`` for ``old``, its failure a ``PromoteRecordError``."""
    def record() -> None:
        try:
            journal.left_read_only(old, host, accept_loss)
        except FarmError as exc:
            raise PromoteRecordError(
                f"cannot record in the control database that {old} is being made read-only "
                f"({first_line(exc)}); nothing changed: fix it (or run 'farm shards init'), "
                "then run the same command again") from None
    return record


def _writable_again(router: Router, master: Host) -> bool:
    """Undo ``_master_pos``'s read-only when nothing was promoted (best effort: a master
    that stopped answering meanwhile stays as it is); whether it is writable again."""
    try:
        with router.connection(master) as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL read_only = 0")
    except FarmError:
        return False
    return True


def _catch_up(router: Router, slave: Host, wait: float) -> tuple[str, str]:
    """Wait up to ``wait`` s for the relay log to be applied; ``(applied, received)``."""
    with router.connection(slave) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SHOW SLAVE STATUS")
        status = cur.fetchone() or {}
        received = status.get("Gtid_IO_Pos") or ""
        if received:
            cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (received, wait))
        cur.execute("SELECT @@gtid_slave_pos")
        return next(iter(cur.fetchone().values())), received


def _make_master(router: Router, slave: Host) -> None:
    """Stop and forget replication, then take writes (each statement harmless twice)."""
    with router.connection(slave) as conn, conn.cursor() as cur:
        cur.execute("STOP SLAVE")
        cur.execute("RESET SLAVE ALL")
        cur.execute("SET GLOBAL read_only = 0")


def _still_read_only(old: str, master_pos: str | None, was_writable: bool) -> str:
    """For a refusal: a live old master this run found read-only stays so (the run that made
    it read-only may have been killed before it could give the writes back); say how to
    undo it, since only the operator knows whether it should take writes."""
    if master_pos is None or was_writable:
        return ""
    return (f"; {old} stays read-only as this promote found it (a promote that stopped may "
            f"have left it so): if it should take writes, run SET GLOBAL read_only = 0 on it")


def _checked(router: Router, m: ShardMap, host: str, old: str, accept_loss: bool,
             wait: float, journal: ReadOnlyRecord) -> tuple[str, str, bool]:
    """The catch-up check: ``(applied, received, behind)``; a refusal (``StaleStateError``)
    gives a live old master its writes back (and its record goes)."""
    master_pos, was_writable = _master_pos(router, m.hosts[old],
                                           _recorder(journal, old, host, accept_loss))
    try:
        applied, received = _catch_up(router, m.hosts[host], wait)
        behind = missing(applied, received) + missing(applied, master_pos or "")
        if behind and not accept_loss:
            left = _still_read_only(old, master_pos, was_writable)
            raise StaleStateError(f"{host} is behind its master {old} ({'; '.join(behind)}): "
                                  "not promoted (start its SQL thread and wait, or "
                                  f"--accept-loss){left}")
    except BaseException:  # refused or failed, nothing promoted: a live master writes again
        if was_writable and _writable_again(router, m.hosts[old]):
            with suppress(FarmError):  # left behind, it says the master may be read-only
                journal.settled(master=old)
        raise
    return applied, received or master_pos or "", bool(behind)


def _map_change(m: ShardMap, old: str, host: str) -> Callable[[dict], None]:
    """The map change, a compare-and-set on the ranges ``old`` held with ``host`` in ``m``."""
    expected = [sorted([r.lo, r.hi] for r in ranges if (r.master, r.slave) == (old, host))
                for ranges in (m.shard_ranges, m.mod_ranges)]

    def change(doc: dict) -> None:
        if _held(doc, old, host) != expected:
            raise _MapMovedError(f"the shard map changed meanwhile (version {doc['version']} "
                                  f"no longer has {host} as the slave of {old} where it "
                                  "was checked); the map was not changed: look at 'farm shards "
                                  "show' and publish the map you want")
        for entry in _pairs(doc):
            if entry["master"] == old and entry["slave"] == host:
                entry["master"] = host
        doc["gone"] = sorted({*doc.get("gone", []), old} - {host})
    return change


def _incomplete(host: str, accept_loss: bool, step: str, exc: FarmError
                ) -> PromoteIncompleteError:
    """One line: what the promote left half done, and what to do now."""
    again = f"farm shards promote {host}{' --accept-loss' if accept_loss else ''}"
    reason = first_line(exc)
    if step == "make":
        return PromoteIncompleteError(f"promote of {host} stopped while making it master "
                                      f"({reason}); run '{again}' again to finish")
    if isinstance(exc, _MapMovedError):
        return PromoteIncompleteError(f"{host} was made a writable master (replication reset), "
                                      f"but {reason}")
    return PromoteIncompleteError(f"{host} was made a writable master (replication reset), but "
                                  f"the shard map may still name its old master ({reason}); "
                                  f"run '{again}' again to finish")


def _settled(journal: ReadOnlyRecord, host: str, version: int, **which: str) -> None:
    """Clear the records of a finished promote; a failure says so in one line."""
    try:
        journal.settled(**which)
    except FarmError as exc:
        raise PromoteIncompleteError(
            f"{host} was promoted (map version {version}), but the record of the master it "
            f"made read-only could not be cleared from the control database "
            f"({first_line(exc)}); run 'farm shards promote {host}' again to clear it") from None


def promote(router: Router, spec: str, host: str, journal: ReadOnlyRecord,
            accept_loss: bool = False, wait: float = 10.0, timeout: float = 10.0) -> Promoted:
    """Promote ``host`` to master of its master's ranges (see the module's docstring);
    ``journal`` records the master made read-only until the promote is done with it."""
    m = router.shardmap
    if host in m.hosts and promoted_already(m, host):
        _make_master(router, m.hosts[host])  # a no-op unless a run stopped before the map
        _settled(journal, host, m.version, promoting=host)
        return Promoted(host, None, m.version, "", "", False, already=True)
    old = old_master_of(m, host)
    applied, received, lost = _checked(router, m, host, old, accept_loss, wait, journal)
    try:
        _make_master(router, m.hosts[host])
    except FarmError as exc:
        raise _incomplete(host, accept_loss, "make", exc) from None
    try:
        new = amend(spec, _map_change(m, old, host), timeout)
    except FarmError as exc:
        raise _incomplete(host, accept_loss, "map", exc) from None
    _settled(journal, host, new.version, master=old)
    return Promoted(host, old, new.version, applied, received, lost)
