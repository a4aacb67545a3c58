"""What ``farm demo --clean`` would remove, found without removing anything: its databases
with their tables and rows, the Redis keys by pattern, and the export files.

``clean_plan`` reads (``SHOW``-like queries, capped counts, Redis ``SCAN``); ``plan_lines``
says it in a few lines. ``demo.clean`` removes exactly this.
"""

from __future__ import annotations

from collections import defaultdict

from demo.clean import (
    farm_keys,
    farm_queues,
    home_feeds,
    orphan_rq_locks,
    queue_jobs,
    remove_demo_exports,
    rq_worker_keys,
)
from demo.guard import control_runs, table_rows
from demo.legacygen.origin import COUNT_CAP, database_rows
from farmcore import keys
from jobs.runtime import Runtime
from shardfarm.mysql.dsn import Host
from shardfarm.redact import redact
from sharding.schema import mod_db, shard_db


def _by_server(rt: Runtime, placed: list[tuple[Host, str]]) -> dict[str, dict]:
    """Databases (``(host, name)``) grouped by server, each server with its tables' rows
    summed over its databases that exist."""
    hosts: dict[tuple, Host] = {}
    names: dict[tuple, list[str]] = defaultdict(list)
    for host, db in placed:
        names[hosts.setdefault(host.server, host).server].append(db)
    out = {}
    for server, dbs in names.items():
        host = hosts[server]
        counts = table_rows(rt, host, dbs)
        tables: dict[str, int] = defaultdict(int)
        for (_, table), n in counts.items():
            tables[table] += n
        found = sorted({db for db, _ in counts})
        if found:
            out[f"{host.host}:{host.port}"] = {"databases": len(found), "first": found[0],
                                               "last": found[-1], "tables": dict(tables)}
    return out


def database_plan(rt: Runtime) -> dict[str, dict]:
    """Every database the clean drops that exists, by kind, with rows per table."""
    m = rt.router.shardmap
    plan = {"shard": _by_server(rt, [(m.master(s), shard_db(s)) for s in m.shards()]),
            "mod-bucket": _by_server(rt, [(m.mod_master(b), mod_db(b))
                                          for b in range(m.buckets)])}
    for kind, dsn in (("legacy", rt.settings.legacy_dsn), ("control", rt.settings.control_dsn)):
        rows = database_rows(dsn)
        if rows:
            plan[kind] = {f"{dsn.host}:{dsn.port}": {"databases": 1, "first": dsn.database,
                                       "last": dsn.database, "tables": rows}}
    return plan


def redis_plan(rt: Runtime, runs: list[dict]) -> dict[str, int]:
    """Keys the clean deletes, by pattern (jobs of each rq queue count as its keys)."""
    conn = rt.settings.redis()
    try:
        plan = {f"{keys.PREFIX}:*": farm_keys(conn, dry=True)}
        for q in farm_queues(runs):
            plan[f"rq queue {q}: jobs, waiting or in a registry"] = queue_jobs(conn, q)
        plan["rq workers of those queues"] = rq_worker_keys(conn, set(farm_queues(runs)),
                                                            dry=True)
        plan["home:* feeds of users on the map's shards"] = home_feeds(conn, rt, dry=True)
        plan["rq's maintenance lock, no worker left"] = orphan_rq_locks(
            conn, set(farm_queues(runs)), dry=True)
        return plan
    finally:
        conn.close()


def clean_plan(rt: Runtime) -> dict:
    """Everything ``clean_everything`` would remove, as JSON."""
    runs = control_runs(rt) or []
    return {"databases": database_plan(rt), "redis": {"url": redact(rt.settings.redis_url),
                                                      "keys": redis_plan(rt, runs)},
            "export_files": remove_demo_exports(runs, dry=True)}


def _rows(tables: dict[str, int]) -> str:
    """``12,345 rows: users 5,000 · pins 7,345`` (``+`` where a count stopped at the cap)."""
    total = sum(tables.values())
    cap = "+" if any(n >= COUNT_CAP for n in tables.values()) else ""
    return f"{total:,}{cap} rows" + (": " + " · ".join(
        f"{t} {n:,}{'+' if n >= COUNT_CAP else ''}" for t, n in tables.items() if n)
        if total else "")


def plan_lines(plan: dict) -> list[str]:
    """What would be removed, a line per group."""
    lines = []
    for kind, servers in plan["databases"].items():
        for server, d in servers.items():
            span = d["first"] if d["databases"] == 1 else f"{d['first']} … {d['last']}"
            lines.append(f"drop {d['databases']:,} {kind} database(s) {span} on {server}: "
                         f"{len(d['tables'])} table(s), {_rows(d['tables'])}")
    redis_keys = plan["redis"]["keys"]
    lines.append(f"delete from Redis {plan['redis']['url']}: " + " · ".join(
        f"{what} {n:,}" for what, n in redis_keys.items()))
    lines.append(f"delete {plan['export_files']:,} export file(s) of the demo's export runs")
    return lines
