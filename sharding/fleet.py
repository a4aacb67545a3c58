"""The fleet as the servers see it (``farm shards status``): per host of the map its role,
the shards it holds, its replication lag, whether it is read-only, and the newest map
version its shards recorded (``shard_state``: the version that last placed them)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pymysql
import pymysql.cursors

from shardfarm.errors import FarmError
from shardfarm.mysql.dsn import Host
from shardfarm.retry import NO_RETRY
from sharding.router import Router
from sharding.schema import shard_table
from sharding.shardmap import ShardMap

BATCH = 200
THREADS = 16  # hosts read at a time


def _ranges(m: ShardMap, name: str, role: str) -> list[list[int]]:
    return [[r.lo, r.hi] for r in m.shard_ranges
            if getattr(r, role) == name and (role == "master" or r.master != name)]


def _role(m: ShardMap, name: str, master_of: list, slave_of: list) -> str:
    if name in m.gone:
        return "gone"
    mod = any(r.master == name for r in m.mod_ranges)
    return "master" if master_of or mod else "slave" if slave_of else "spare"


def _told(cur: pymysql.cursors.Cursor, shards: list[int]) -> int | None:
    """The newest map version any of ``shards`` recorded on this server (``None``: none)."""
    best = None
    for i in range(0, len(shards), BATCH):
        batch = shards[i:i + BATCH]
        sql = " UNION ALL ".join(f"SELECT MAX(map_version) AS v FROM "
                                 f"{shard_table(s, 'shard_state')}" for s in batch)
        try:
            cur.execute(f"SELECT MAX(v) FROM ({sql}) AS t")
        except pymysql.MySQLError:  # a shard without its database here: one at a time
            if len(batch) > 1:
                best = max(best or 0, *(_told(cur, [s]) or 0 for s in batch)) or best
            continue
        v = cur.fetchone()[0]
        if v is not None:
            best = max(best or 0, int(v))
    return best


def _server(router: Router, m: ShardMap, name: str, shards: list[int]) -> dict:
    with router.connection(m.hosts[name]) as conn, \
            conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SELECT @@read_only AS ro")
        read_only = bool(cur.fetchone()["ro"])
        cur.execute("SHOW SLAVE STATUS")
        repl = cur.fetchone()
    with router.connection(m.hosts[name]) as conn, conn.cursor() as cur:
        told = _told(cur, shards)
    lag = None
    if repl:
        lag = repl.get("Seconds_Behind_Master")
        lag = "stopped" if repl.get("Slave_SQL_Running") != "Yes" or lag is None else int(lag)
    return {"read_only": read_only, "replicates_from": (
        f"{repl['Master_Host']}:{repl['Master_Port']}" if repl else None),
        "lag_seconds": lag, "map_version": told}


def host_status(router: Router, m: ShardMap, name: str, down: dict | None = None) -> dict:
    """One host's line of ``farm shards status`` (``reachable: false`` and the error if the
    server does not answer, or is in ``down``: server -> error, found already)."""
    h = m.hosts[name]
    master_of, slave_of = _ranges(m, name, "master"), _ranges(m, name, "slave")
    out = {"host": name, "address": f"{h.host}:{h.port}",
           "role": _role(m, name, master_of, slave_of), "master_of": master_of,
           "slave_of": slave_of}
    shards = [s for lo, hi in master_of + slave_of for s in range(lo, hi + 1)]
    failed = (down or {}).get(h.server)
    if failed is None:
        try:
            return out | {"reachable": True, **_server(router, m, name, shards)}
        except (FarmError, pymysql.MySQLError) as exc:
            failed = exc
    return out | {"reachable": False, "error": str(failed).splitlines()[0][:300]}


def unanswered(doc: dict) -> list[str]:
    """The hosts of a ``fleet_status`` document that did not answer, but those the map marks
    gone (a promote replaced them: they are not expected to)."""
    return [h["host"] for h in doc["hosts"] if not h["reachable"] and h["role"] != "gone"]


def fleet_status(router: Router) -> dict:
    """Every host of the map in force, with the map's version. Each physical server is asked
    once first, all at once: one that does not answer costs one FARM_CONNECT_TIMEOUT in
    all, not one per host name on it; then the hosts are read side by side."""
    m = router.shardmap
    down = _unanswering(router, m)
    with ThreadPoolExecutor(THREADS) as pool:
        hosts = list(pool.map(lambda n: host_status(router, m, n, down), m.hosts))
    return {"version": m.version, "hosts": hosts}


def _unanswering(router: Router, m: ShardMap) -> dict[tuple, FarmError]:
    """The servers of the map's hosts that do not answer one ``SELECT 1``, with the error."""
    servers = {h.server: h for h in m.hosts.values()}

    def ask(host: Host) -> FarmError | None:
        try:
            router.query(host, "SELECT 1", policy=NO_RETRY)
        except FarmError as exc:
            return exc
        return None
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        found = dict(zip(servers, pool.map(ask, servers.values()), strict=True))
    return {server: exc for server, exc in found.items() if exc is not None}
