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
"""

from __future__ import annotations

from dataclasses import dataclass

import pymysql.cursors

from shardfarm.errors import FarmError, StaleStateError, UsageError
from shardfarm.mysql.dsn import Host
from sharding.mappublish import amend
from sharding.router import Router
from sharding.shardmap import ShardMap


@dataclass(frozen=True)
class Promoted:
    """What ``promote`` did."""

    host: str
    old_master: str
    version: int
    applied: str
    received: str
    lost: bool


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


def _master_pos(router: Router, master: Host) -> tuple[str | None, bool]:
    """Make a master that still answers read-only; its binlog position (``None``: dead) and
    whether it was writable until now (``_writable_again`` undoes it on a refusal)."""
    try:
        with router.connection(master) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@read_only")
            was_writable = not int(cur.fetchone()[0])
            cur.execute("SET GLOBAL read_only = 1")
            cur.execute("SELECT @@gtid_binlog_pos")
            return cur.fetchone()[0], was_writable
    except FarmError:
        return None, False


def _writable_again(router: Router, master: Host) -> None:
    """Undo ``_master_pos``'s read-only when nothing was promoted (best effort: a master
    that stopped answering meanwhile stays as it is)."""
    try:
        with router.connection(master) as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL read_only = 0")
    except FarmError:
        pass


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
    with router.connection(slave) as conn, conn.cursor() as cur:
        cur.execute("STOP SLAVE")
        cur.execute("RESET SLAVE ALL")
        cur.execute("SET GLOBAL read_only = 0")


def promote(router: Router, spec: str, host: str, accept_loss: bool = False,
            wait: float = 10.0, timeout: float = 10.0) -> Promoted:
    """Promote ``host`` to master of its master's ranges (see the module's docstring)."""
    m = router.shardmap
    old = old_master_of(m, host)
    slave = m.hosts[host]
    master_pos, was_writable = _master_pos(router, m.hosts[old])
    try:
        applied, received = _catch_up(router, slave, wait)
        behind = missing(applied, received) + missing(applied, master_pos or "")
        if behind and not accept_loss:
            raise StaleStateError(f"{host} is behind its master {old} ({'; '.join(behind)}): "
                                  "not promoted (start its SQL thread and wait, or "
                                  "--accept-loss)")
    except BaseException:  # refused or failed, nothing promoted: a live master writes again
        if was_writable:
            _writable_again(router, m.hosts[old])
        raise
    _make_master(router, slave)

    def change(doc: dict) -> None:
        for entry in [*doc["shards"], *doc["mod"]["ranges"]]:
            if entry["master"] == old and entry["slave"] == host:
                entry["master"] = host
        doc["gone"] = sorted({*doc.get("gone", []), old} - {host})
    new = amend(spec, change, timeout)
    return Promoted(host, old, new.version, applied, received or master_pos or "",
                    bool(behind))
