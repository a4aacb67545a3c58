"""The parts of ``farm demo``'s report, and ``farm demo --clean``."""

from __future__ import annotations

import json
import os
from contextlib import suppress

import pymysql
import redis

from exporters import export as exporter
from exporters.destinations import FileDestination, open_destination
from exporters.dump import EXPORT_TABLES
from jobs.runtime import Runtime
from scripts.app import App
from shardfarm.db import drop_database
from shardfarm.errors import FarmError
from sharding import hotspot, ids
from sharding.mappings import MappingStore
from sharding.objects import ObjectStore
from sharding.schema import mod_db, shard_db


def table_lines(summary: dict) -> list[str]:
    """``table  loaded  quarantined`` lines."""
    out = [f"  {'legacy table':<14}{'loaded':>10}{'quarantined':>13}"]
    for t, n in summary["loaded"].items():
        out.append(f"  {t:<14}{n:>10,}{summary['quarantined'].get(t, 0):>13,}")
    return out


def quarantine_lines(rt: Runtime, run_id: str) -> list[str]:
    """``table.reason  count`` lines of a run's quarantine."""
    return [f"  {t + '.' + r:<32}{n:>7,}" for t, r, n in rt.ledger.quarantine_reasons(run_id)]


def _biggest_board(app: App) -> int | None:
    best = (0, None)
    for shard in app.router.shardmap.shards():
        q = f"`{shard_db(shard)}`.`board_has_pins`"
        rows = app.router.query(app.router.host_for(shard),
                                f"SELECT from_id, COUNT(*) n FROM {q} GROUP BY from_id "
                                "ORDER BY n DESC LIMIT 1", (), shard)
        if rows and rows[0][1] > best[0]:
            best = (rows[0][1], rows[0][0])
    return best[1]


def board_page_lines(app: App, limit: int = 8) -> tuple[list[str], int | None]:
    """A board page rendered from the shards: board -> pin IDs -> multi-get of pins."""
    board = _biggest_board(app)
    if board is None:
        return ["(no board to show)"], None
    objects = ObjectStore(app.router)
    b = objects.get(board).data
    store = MappingStore(app.router, "board_has_pins")
    page = store.page(board, limit=limit)
    pins = objects.get_many(page.ids)
    out = [f"board page: {b['name']!r} ({store.count(board)} pins), newest first "
           "(board_has_pins page, then a multi-get grouped by shard):"]
    for pin in pins.found:
        text = (pin.data.get("details") or "").replace("\n", " ")[:48]
        out.append(f"  {pin.data['created_at']}  pin {pin.id}  {text}")
    out.append(f"  next page cursor: {page.next_cursor}")
    return out, board


def hot_board_lines(app: App) -> list[str]:
    """The hotspot directory of the most followed board, and its first followers."""
    rows = []
    for shard in app.router.shardmap.shards():
        q = f"`{shard_db(shard)}`.`board_followedby_user_shard`"
        rows += app.router.query(app.router.host_for(shard),
                                 f"SELECT board_id, SUM(row_count) FROM {q} GROUP BY board_id",
                                 (), shard)
    if not rows:
        return ["no hot boards (nothing above the rebalance threshold)"]
    board, n = max(rows, key=lambda r: r[1])
    entry = hotspot.Directory(app.router).get(board)
    page = hotspot.followers(app.router, board, 5)
    return [f"hot board {board} ({int(n)} followers): directory state {entry.state}, "
            f"followers spread over shards {list(entry.shards)} (home shard "
            f"{ids.shard_of(board)} keeps none)",
            f"  newest followers (fan-out read merged by sequence): {page.ids}"]


def export_lines(app: App, date: str) -> list[str]:
    """Where the export of ``date`` is: each table's folder, files, rows and size."""
    dest = open_destination(app.settings.export_url)
    out = [f"exports of dt={date} under {dest.url}/ (manifest, then _SUCCESS):"]
    for table in EXPORT_TABLES:
        folder = exporter.folder_of(table, date)
        raw = dest.read(folder + exporter.MANIFEST)
        if raw is None:
            continue
        m = json.loads(raw)
        done = "_SUCCESS" if dest.exists(folder + exporter.SUCCESS) else "incomplete"
        out.append(f"  {folder:<38}{len(m['files']):>3} parts{m['rows']:>10,} rows"
                   f"{m['bytes'] / 1e6:>8.2f} MB  {done}")
    if isinstance(dest, FileDestination):
        out.append(f"  read as Spark would, e.g. DuckDB: SELECT count(*) FROM read_json("
                   f"'{dest.root}/pins/*/*.jsonl.gz', hive_partitioning=true)")
    return out


def remove_demo_exports(app: App) -> int:
    """Delete the files of every export the demo ran (never the rest of the destination)."""
    try:
        ledger = app.runtime.ledger
        demo_runs = [r for r in map(ledger.run, ledger.runs(limit=100_000))
                     if r["kind"] == "export" and r["params"].get("demo")]
    except (FarmError, pymysql.MySQLError):
        return 0  # no control database: the demo has not exported anything
    removed = 0
    for run in demo_runs:
        p = run["params"]
        dest = open_destination(p["dest"])
        for table in p["kinds"]:
            for key in dest.list(exporter.folder_of(table, p["date"])):
                dest.delete(key)
                removed += 1
        if isinstance(dest, FileDestination):
            _prune_empty(dest.root)
    return removed


def _prune_empty(root) -> None:
    """Remove empty directories under ``root`` (bottom up), and ``root`` if it ends empty."""
    for path, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        with suppress(OSError):  # not empty
            os.rmdir(path)


def clean_everything(app: App) -> dict:
    """Drop the demo's shard, mod, legacy and control databases and the demo's exports."""
    exported = remove_demo_exports(app)
    m = app.router.shardmap
    dropped = 0
    for shard in m.shards():
        dropped += _drop(app, m.master(shard), shard_db(shard))
    for b in range(m.buckets):
        dropped += _drop(app, m.mod_master(b), mod_db(b))
    for dsn in (app.settings.legacy_dsn, app.settings.control_dsn):
        drop_database(dsn)
    conn = redis.Redis.from_url(app.settings.redis_url)
    keys = 0
    for pattern in ("rq:*", "farm:*", "home:*"):
        for key in conn.scan_iter(match=pattern, count=1000):
            keys += conn.delete(key)
    return {"dropped_databases": dropped + 2, "redis_keys_deleted": keys,
            "export_files_deleted": exported}


def _drop(app: App, host, db: str) -> int:
    with app.router.connection(host) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
    return 1
