"""What ``farm demo`` finds before it starts, and whether it made it.

The demo owns data it can prove it made:

- the legacy database, when ``farm_generated`` (written by the generator) says
  ``made_by = "farm demo"``, or when its tables hold no rows;
- the shard databases of the map, when they hold no rows, or when every run of the
  control database that writes to shards was started by the demo (its ``params``
  carry ``demo``) and none of them was forced into data the demo did not make.

Anything else is someone else's data: the demo refuses it unless ``--force``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

import pymysql

from demo.legacygen.origin import COUNT_CAP, describe_rows, legacy_rows, read_origin, where
from jobs.runtime import Runtime
from shardfarm.errors import DatabaseError, FatalError
from shardfarm.mysql.db import connect
from shardfarm.mysql.dsn import Host
from shardfarm.mysql.pool import translate
from sharding.schema import DIRECTORY_TABLES, MAPPING_TABLES, OBJECT_TABLES, shard_db

MADE_BY = "farm demo"
DATA_TABLES = (*OBJECT_TABLES, *MAPPING_TABLES, *DIRECTORY_TABLES)
READ_ONLY_KINDS = ("verify", "export")  # runs that never write to the shards
_BATCH = 200  # counted tables per statement
NO_DATABASE, NO_TABLE = 1049, 1146  # MySQL error codes


@dataclass
class Survey:
    """What the demo found: legacy rows and their maker, shard rows, control runs."""

    legacy: dict[str, int]
    origin: dict | None
    shard_rows: dict[str, tuple[int, int]]     # "host:port" -> (databases with rows, rows)
    runs: list[dict] | None                    # None: no control database

    @property
    def shards_hold_rows(self) -> bool:
        """Whether any shard database of the map holds a row."""
        return any(n for _, n in self.shard_rows.values())


def control_runs(rt: Runtime) -> list[dict] | None:
    """``{"run_id", "kind", "queue", "params"}`` of every run; ``None`` without a control DB."""
    dsn = rt.settings.control_dsn
    try:
        conn = connect(dsn)
    except DatabaseError as exc:
        if exc.code == NO_DATABASE:
            return None  # no control database: nothing recorded
        raise
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT run_id, kind, queue, params FROM runs ORDER BY created_at")
            return [{"run_id": r, "kind": k, "queue": q, "params": json.loads(p)}
                    for r, k, q, p in cur.fetchall()]
    except pymysql.MySQLError as exc:
        if exc.args and exc.args[0] == NO_TABLE:
            return None  # a control database without its tables: nothing recorded
        raise translate(exc, f"{dsn.host}:{dsn.port}", None) from None
    finally:
        conn.close()


def shard_rows(rt: Runtime) -> dict[str, tuple[int, int]]:
    """Per server of the map: how many shard databases hold rows, and how many rows."""
    m = rt.router.shardmap
    hosts: dict[tuple, Host] = {}
    by_server: dict[tuple, list[str]] = defaultdict(list)
    for shard in m.shards():  # several host names may point at one server: count it once
        host = hosts.setdefault(m.master(shard).server, m.master(shard))
        by_server[host.server].append(shard_db(shard))
    out = {}
    for server, dbs in by_server.items():
        host = hosts[server]
        counts = _count_tables(rt, host, dbs)
        if counts:
            out[f"{host.host}:{host.port}"] = (sum(1 for n in counts.values() if n),
                                                sum(counts.values()))
    return out


def _count_tables(rt: Runtime, host: Host, dbs: list[str]) -> dict[str, int]:
    """Rows per database (each table counted up to ``COUNT_CAP``), existing tables only."""
    out: dict[str, int] = defaultdict(int)
    for (db, _), n in table_rows(rt, host, dbs, DATA_TABLES).items():
        out[db] += n
    return out


def table_rows(rt: Runtime, host: Host, dbs: list[str], only: tuple[str, ...] | None = None
               ) -> dict[tuple[str, str], int]:
    """Rows per ``(database, table)`` of ``dbs`` on ``host`` (tables of ``only`` if given),
    each counted up to ``COUNT_CAP``; existing tables only, ``_BATCH`` per statement."""
    marks = ",".join(["%s"] * len(dbs))
    tables = [(d, t) for d, t in rt.router.query(
        host, f"SELECT table_schema, table_name FROM information_schema.tables "
              f"WHERE table_schema IN ({marks}) ORDER BY table_schema, table_name", dbs)
        if only is None or t in only]
    out: dict[tuple[str, str], int] = {}
    for i in range(0, len(tables), _BATCH):
        sql = " UNION ALL ".join(f"SELECT '{d}', '{t}', COUNT(*) FROM (SELECT 1 FROM "
                                 f"`{d}`.`{t}` LIMIT {COUNT_CAP}) x"
                                 for d, t in tables[i:i + _BATCH])
        out.update({(db, t): int(n) for db, t, n in rt.router.query(host, sql)})
    return out


def survey(rt: Runtime) -> Survey:
    """Look at the legacy database, the shards of the map and the control database."""
    dsn = rt.settings.legacy_dsn
    legacy = legacy_rows(dsn)
    origin = read_origin(dsn) if sum(legacy.values()) else None
    return Survey(legacy, origin, shard_rows(rt), control_runs(rt))


def _writers(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["kind"] not in READ_ONLY_KINDS]


def foreign(rt: Runtime, s: Survey) -> dict[str, str]:
    """What the survey found that the demo did not make: ``{"legacy"|"shards": phrase}``."""
    found = {}
    if sum(s.legacy.values()) and (s.origin or {}).get("made_by") != MADE_BY:
        maker = f", made by '{s.origin['made_by']}'" if s.origin else ""
        found["legacy"] = (f"legacy {where(rt.settings.legacy_dsn)} holds "
                           f"{describe_rows(s.legacy)}{maker}")
    if s.shards_hold_rows and (why := _shards_not_ours(rt, s)):
        held = "; ".join(f"{_databases(k)} of the map on {server} hold{'s' if k == 1 else ''} "
                         f"{n:,} row{'' if n == 1 else 's'}"
                         for server, (k, n) in s.shard_rows.items() if n)
        found["shards"] = f"{held} ({why})"
    return found


def _databases(k: int) -> str:
    return f"{k} shard database{'' if k == 1 else 's'}"


def _shards_not_ours(rt: Runtime, s: Survey) -> str | None:
    """Why rows in the shards are not the demo's, or ``None`` when they are."""
    control = f"control database '{rt.settings.control_dsn.database}'"
    if s.runs is None:
        return f"the {control} does not exist, so no demo run made them"
    writers = _writers(s.runs)
    if not writers:
        return f"the {control} records no run that wrote them"
    others = [r["run_id"] for r in writers if not r["params"].get("demo")]
    if others:
        return f"the {control} records runs the demo did not start: {', '.join(others[:3])}"
    if any(isinstance(r["params"]["demo"], dict) and r["params"]["demo"].get("forced")
           for r in writers):
        return "an earlier 'farm demo --force' ran into data the demo did not make"
    return None


def previous_data_set(s: Survey) -> dict | None:
    """``{"users", "seed"}`` of the demo data set already there, if any."""
    if s.origin and s.origin.get("made_by") == MADE_BY:
        return {"users": s.origin["users"], "seed": s.origin["seed"]}
    for run in reversed(_writers(s.runs or [])):
        demo = run["params"].get("demo")
        if run["kind"] == "migrate" and isinstance(demo, dict):
            return {"users": demo.get("users"), "seed": demo.get("seed")}
    return None


def refusal(found: dict[str, str]) -> FatalError:
    """The one-line refusal: what was found, and the two ways on."""
    return FatalError(
        f"demo: {'; '.join(found.values())}: data the demo did not make. Run "
        "'farm demo --clean' to delete what the demo makes (the demo map's shard and mod "
        "databases, the legacy and control databases, the farm's Redis keys and the demo's "
        "exports), or 'farm demo --force' to run into it anyway")
