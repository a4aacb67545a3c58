"""``farm demo``'s report: what it made, read back from the shards and the exports, and
what failed with the commands that show the rest."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from demo.phases import Phases, RunResult
from exporters import export as exporter
from exporters.destinations import FileDestination, open_destination
from exporters.dump import EXPORT_TABLES
from jobs.runtime import Runtime
from loaders.mappings.reverse import REVERSES
from shardfarm.errors import FarmError
from sharding import hotspot, ids
from sharding.hotspot import FOLLOWERS
from sharding.mappings import MappingStore
from sharding.objects import ObjectStore
from sharding.schema import shard_db


def table_lines(summary: dict) -> list[str]:
    """``table  loaded  quarantined`` lines."""
    out = [f"  {'legacy table':<14}{'loaded':>10}{'quarantined':>13}"]
    for t, n in summary["loaded"].items():
        out.append(f"  {t:<14}{n:>10,}{summary['quarantined'].get(t, 0):>13,}")
    return out


def quarantine_lines(rt: Runtime, run_id: str) -> list[str]:
    """``table.reason  count`` lines of a run's quarantine."""
    return [f"  {t + '.' + r:<32}{n:>7,}" for t, r, n in rt.ledger.quarantine.reasons(run_id)]


def _biggest_board(rt: Runtime) -> int | None:
    best = (0, None)
    for shard in rt.router.shardmap.shards():
        q = f"`{shard_db(shard)}`.`board_has_pins`"
        rows = rt.router.query(rt.router.host_for(shard),
                               f"SELECT from_id, COUNT(*) n FROM {q} GROUP BY from_id "
                               "ORDER BY n DESC LIMIT 1", (), shard)
        if rows and rows[0][1] > best[0]:
            best = (rows[0][1], rows[0][0])
    return best[1]


def board_page_lines(rt: Runtime, limit: int = 8) -> tuple[list[str], int | None]:
    """A board page rendered from the shards: board -> pin IDs -> multi-get of pins."""
    board = _biggest_board(rt)
    if board is None:
        return ["(no board to show)"], None
    objects = ObjectStore(rt.router)
    b = objects.get(board).data
    store = MappingStore(rt.router, "board_has_pins")
    page = store.page(board, limit=limit)
    pins = objects.get_many(page.ids)
    out = [f"board page: {b['name']!r} ({store.count(board)} pins), newest first "
           "(board_has_pins page, then a multi-get grouped by shard):"]
    for pin in pins.found:
        text = (pin.data.get("details") or "").replace("\n", " ")[:48]
        out.append(f"  {pin.data['created_at']}  pin {pin.id}  {text}")
    out.append(f"  next page cursor: {page.next_cursor}")
    return out, board


def hot_board_lines(rt: Runtime) -> list[str]:
    """The hotspot directory of the most followed board, and its first followers."""
    rows = []
    for shard in rt.router.shardmap.shards():
        q = f"`{shard_db(shard)}`.`board_followedby_user_shard`"
        rows += rt.router.query(rt.router.host_for(shard),
                                f"SELECT board_id, SUM(row_count) FROM {q} GROUP BY board_id",
                                (), shard)
    if not rows:
        return ["no hot boards (nothing above the rebalance threshold)"]
    board, n = max(rows, key=lambda r: r[1])
    entry = hotspot.Directory(rt.router).get(board)
    page = hotspot.followers(rt.router, board, 5)
    return [f"hot board {board} ({int(n)} followers): directory state {entry.state}, "
            f"followers spread over shards {list(entry.shards)} (home shard "
            f"{ids.shard_of(board)} keeps none)",
            f"  newest followers (fan-out read merged by sequence): {page.ids}"]


def export_lines(rt: Runtime, date: str, suspect: Iterable[str] = ()) -> list[str]:
    """Where the export of ``date`` is: each table's folder, files, rows and size.

    Tables in ``suspect`` were written by a run that failed: their line says so.
    """
    dest = open_destination(rt.settings.export_url)
    out = [f"exports of dt={date} under {dest.url}/ (manifest, then _SUCCESS):"]
    for table in EXPORT_TABLES:
        folder = exporter.folder_of(table, date)
        raw = dest.read(folder + exporter.MANIFEST)
        if raw is None:
            continue
        m = json.loads(raw)
        done = "_SUCCESS" if dest.exists(folder + exporter.SUCCESS) else "incomplete"
        note = "  (its source run FAILED: incomplete)" if table in suspect else ""
        out.append(f"  {folder:<38}{len(m['files']):>3} parts{m['rows']:>10,} rows"
                   f"{m['bytes'] / 1e6:>8.2f} MB  {done}{note}")
    if isinstance(dest, FileDestination):
        out.append(f"  read as Spark would, e.g. DuckDB: SELECT count(*) FROM read_json("
                   f"'{dest.root}/pins/*/*.jsonl.gz', hive_partitioning=true)")
    return out


def failure_lines(rt: Runtime, results: list[RunResult], migrate_run: str,
                  reasons: int = 3) -> list[str]:
    """What failed: each run, its first reasons and the command that shows the rest."""
    bad = [r for r in results if not r.ok]
    if not bad:
        return []
    out = [f"FAILED: {len(bad)} of {len(results)} runs did not end well:"]
    for r in bad:
        out.append(f"  {r.phase}: {r.problem()}")
        if r.status != "done" or r.failed:
            for f in rt.ledger.failures(r.run_id, limit=reasons):
                why = (f["last_error"] or "no reason recorded").splitlines()[0][:240]
                out.append(f"    chunk {f['chunk_id']} ({f['kind']}): {why}")
            out.append(f"    see them all: farm failed --run {r.run_id}")
        if r.mismatches:
            _, first = rt.ledger.mismatches.of_run(r.run_id, limit=reasons)
            out += [f"    {m['legacy_table']} {m['legacy_key']} {m['target']}: {m['problem']}"
                    for m in first]
            out.append(f"    see them all: farm verify --run {migrate_run}")
    return out


def safely(what: str, render: Callable[[], list[str]]) -> list[str]:
    """``render()``, or one line saying why ``what`` could not be shown."""
    try:
        return render()
    except FarmError as exc:
        return [f"({what} not shown: {str(exc).splitlines()[0]})"]


def _suspect_tables(p: Phases) -> set[str]:
    """Exported tables written by a run that failed."""
    if p.failed("migrate"):
        return set(EXPORT_TABLES)
    return ((set(REVERSES) if p.failed("reverse mappings") else set())
            | ({FOLLOWERS} if p.failed("rebalance hot boards") else set()))


def _head(p: Phases, mig: RunResult, quarantine: list[str]) -> list[str]:
    """The title, the migration's tables, the time per phase, quarantine and verify."""
    ver = p.results["verify"]
    return ["", "shardfarm demo" + (" FAILED: see the end of this report" if p.bad() else ""),
            "=" * 60, f"migration {mig.run_id}: {mig.status}, {mig.failed} failed chunks",
            *table_lines(mig.summary), "", "time per phase:", *p.lines(), "",
            "quarantined rows by reason:", *quarantine, "",
            f"verify {ver.run_id}: {ver.status}, {ver.mismatches} mismatches", ""]


def build(rt: Runtime, p: Phases, mig: RunResult, date: str) -> list[str]:
    """The report's lines: what the demo made, and what failed with the commands to see more.

    ``mig`` is how the migration ended, ``date`` the partition the demo exported.
    """
    out = _head(p, mig, quarantine_lines(rt, mig.run_id))
    try:
        page, board = board_page_lines(rt)
    except FarmError as exc:
        page, board = [f"(board page not shown: {str(exc).splitlines()[0]})"], None
    out += page
    if bad := p.failed("reverse mappings", "rebalance hot boards"):
        out += ["", f"hot boards not shown: {bad.phase} {bad.problem()}"]
    else:
        out += ["", *safely("hot boards", lambda: hot_board_lines(rt))]
    if board:
        out += ["", f"decoded board ID {board}: {ids.decode(board).as_dict()}"]
    out += ["", *safely("exports", lambda: export_lines(rt, date, _suspect_tables(p)))]
    if p.bad():
        out += ["", *failure_lines(rt, list(p.results.values()), mig.run_id)]
    return out
