"""Bulk writes grouped by destination: one transaction per group of shards on one server,
round trips per mod server.

Shard tables are written with ``LOAD DATA LOCAL INFILE`` in primary-key order, after
the chunk's fencing token is checked on that shard, in one transaction with up to
``GROUP_SHARDS`` shards of the same server (one commit for all: with 4,096 shards a chunk
touches most of them, and a commit each was a quarter of its time), on connections
allowed ``LOCAL INFILE`` (no other connection is): running it twice leaves the same
rows. A table getting a few small rows (``INSERT_ROWS`` rows and ``INSERT_CHARS``
characters of documents at most) gets one multi-row ``INSERT`` instead (no file, one
round trip less), and a group whose tables all do is pipelined
(``shardfarm.mysql.pipeline``, on connections allowed multi-statements, never files):
its fence, shard-state and slot checks go first and are judged before its writes are
sent, a few round trips in all. Mapping rows are loaded with ``REPLACE`` (a row's key is its
owner). An object row never replaces a row it does not own (``loaders.migration.claims``):
slots the chunk's survey found empty are loaded with ``IGNORE``, and only slots
locked and confirmed as the row's own (or all of them, if an ``IGNORE`` skipped
any) are loaded with ``REPLACE``. Mod-bucket rows (a few per bucket,
thousands of buckets) are idempotent upserts sent to each mod server as
multi-statement round trips of ``MOD_TX_STATEMENTS`` statements, on connections
allowed multi-statements, each round trip one transaction after its fence check
(``fencing.check_mod``: two round trips more, per range of the map it writes to).
Measured on MariaDB 10.11 with durable commits, per statement:
autocommit ~260-500 us (a log flush each), 64 per transaction ~100 us, 4,096 per
transaction ~250 us (InnoDB slows with thousands of tables in one transaction).
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from itertools import chain
from typing import TYPE_CHECKING

from loaders.migration import claims
from loaders.migration.build import TargetRows
from shardfarm.mysql.infile import temp_tsv
from shardfarm.mysql.pipeline import Pipeline, Result
from shardfarm.parallel import run_parallel
from sharding import fencing
from sharding.fencing import FenceToken
from sharding.router import Router
from sharding.schema import mod_table, shard_table
from sharding.shardmap import ShardMap

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

BATCH = 1000
WRITE_THREADS = 2
MOD_TX_STATEMENTS = 64
GROUP_SHARDS = 128  # shards of one server written in one transaction (one commit)
COLUMNS = {"object": "(local_id, data, active)", "mapping": "(from_id, to_id, sequence)"}
LOAD_MODES = {"REPLACE": "REPLACE", "IGNORE": "IGNORE"}
INSERT_MODES = {"REPLACE": "REPLACE", "IGNORE": "INSERT IGNORE"}
INSERT_ROWS = 200  # a shard table's rows up to this many go as an INSERT, not a file,
INSERT_CHARS = 1 << 18  # if their documents hold this many characters at most (see _as_insert)

MOD_UPSERT = {
    # Small legacy IDs (below 2**35) map by a pure function (the latest placement wins); a
    # big legacy ID keeps the local ID the shard gave it first.
    "legacy_id_map": ("(type_id, legacy_id, new_id)", "ON DUPLICATE KEY UPDATE new_id = "
                      "IF(legacy_id BETWEEN 1 AND 34359738367, VALUES(new_id), new_id)"),
    "username_to_user": ("(username, user_id)",
                         "ON DUPLICATE KEY UPDATE user_id = LEAST(user_id, VALUES(user_id))"),
    "email_to_user": ("(email, user_id)",
                      "ON DUPLICATE KEY UPDATE user_id = LEAST(user_id, VALUES(user_id))"),
}


def _tsv_backslash_escaped(kind: str, rows: list[tuple]) -> bytes:
    """LOAD DATA text (UTF-8), tab-separated, escaping backslashes only: the cells are
    integers and JSON text, which holds no raw tab, newline, carriage return or NUL (JSON
    escapes them). Only the documents can hold a backslash, so the whole text is escaped at
    once. Each document is encoded on its own: joined as ``str``, one non-ASCII document
    widens the whole text to 2 or 4 bytes a character (measured: 2-3x slower)."""
    if kind == "object":
        text = b"".join([b"%d\t%b\t1\n" % (local, data.encode())
                         for local, data, _ in sorted(rows)])
        return text.replace(b"\\", b"\\\\")
    rows = sorted(rows)  # three integers a row: one %-format in C, not a string each
    return (b"%d\t%d\t%d\n" * len(rows)) % tuple(chain.from_iterable(rows))


def load_rows(cur: Cursor, q: str, kind: str, rows: list[tuple], mode: str = "REPLACE") -> int:
    """Inside a shard transaction: ``rows`` into ``q`` (``kind`` is ``object`` or
    ``mapping``) with ``REPLACE`` (or ``IGNORE``); returns the rows affected. A few small
    rows (``_as_insert``) go as one multi-row statement, others as ``LOAD DATA LOCAL
    INFILE`` (the connection must allow ``LOCAL INFILE``)."""
    if _as_insert(kind, rows):
        return _insert_rows(cur, q, kind, rows, mode)
    return load_text(cur, q, kind, _tsv_backslash_escaped(kind, rows), mode)


def _as_insert(kind: str, rows: list[tuple]) -> bool:
    """Whether ``rows`` go as one statement: ``INSERT_ROWS`` rows at most, whose documents
    hold ``INSERT_CHARS`` characters at most. Escaped, a statement is then under 2 MiB,
    far below any server's ``max_allowed_packet``; ``LOAD DATA`` streams any size."""
    return len(rows) <= INSERT_ROWS and (
        kind != "object" or sum(len(r[1]) for r in rows) <= INSERT_CHARS)


def _insert_rows(cur: Cursor, q: str, kind: str, rows: list[tuple], mode: str) -> int:
    """A few rows as one ``REPLACE`` or ``INSERT IGNORE`` in primary-key order, with the
    same rows affected as ``LOAD DATA``: no file to write and one round trip, not two."""
    return cur.execute(*_insert_statement(q, kind, rows, mode)) if rows else 0


def _insert_statement(q: str, kind: str, rows: list[tuple], mode: str) -> tuple[str, list]:
    """The multi-row statement writing ``rows`` (at least one) and its parameters."""
    if kind == "object":
        marks, params = "(%s,%s,1)", [v for local, data, _ in sorted(rows) for v in (local, data)]
    else:
        marks, params = "(%s,%s,%s)", [v for row in sorted(rows) for v in row]
    return (f"{INSERT_MODES[mode]} INTO {q} {COLUMNS[kind]} VALUES "
            + ",".join([marks] * len(rows)), params)


def load_text(cur: Cursor, q: str, kind: str, text: str | bytes, mode: str = "REPLACE") -> int:
    """``load_rows`` of rows already rendered as ``LOAD DATA`` text (tab-separated lines,
    backslash-escaped, in primary-key order); returns the rows affected."""
    with temp_tsv(text) as path:
        return cur.execute(f"LOAD DATA LOCAL INFILE %s {LOAD_MODES[mode]} INTO TABLE {q} "
                           f"CHARACTER SET utf8mb4 {COLUMNS[kind]}", (path,))


def _owned_and_new(rows: list[tuple], held: set[int]) -> tuple[list[tuple], list[tuple]]:
    """``rows`` whose slot the survey found held by their own row, and the others."""
    if not held:
        return [], rows
    return [r for r in rows if r[0] in held], [r for r in rows if r[0] not in held]


def _replace_owned(cur: Cursor, shard: int, q: str, rows: list[tuple]) -> None:
    """Lock the slots of ``rows``, confirm each is empty or their own, and replace them."""
    claims.confirm_owned(cur, shard, q, rows)
    load_rows(cur, q, "object", rows)


def _load_objects(cur: Cursor, shard: int, table: str, rows: list[tuple], held: set[int]
                  ) -> None:
    """Object rows into their slots, never over a row they do not own: new slots with
    ``IGNORE``; slots held by their own row (``held``), or every slot if the ``IGNORE``
    skipped some, locked, confirmed and then replaced."""
    q = shard_table(shard, table)
    mine, new = _owned_and_new(rows, held)
    if new and load_rows(cur, q, "object", new, "IGNORE") < len(new):
        mine = rows  # a slot was filled since the survey: whose it is decides
    if mine:
        _replace_owned(cur, shard, q, mine)


def _queue_objects(pipe: Pipeline, shard: int, table: str, rows: list[tuple], held: set[int]
                   ) -> None:
    """``_load_objects`` queued in a pipeline (rows ``_as_insert`` takes): the
    ``IGNORE``'s count is judged when it flushes, and if it skipped a slot, every slot is
    confirmed and replaced then, in the same transaction."""
    q = shard_table(shard, table)
    mine, new = _owned_and_new(rows, held)

    def skipped(res: Result) -> None:  # a slot was filled since the survey
        if res.rowcount < len(new):
            pipe.then(lambda cur: _replace_owned(cur, shard, q, rows))
    if new:
        pipe.add(*_insert_statement(q, "object", new, "IGNORE"), check=skipped)
    if mine:
        claims.queue_confirm_owned(pipe, shard, q, mine)
        pipe.add(*_insert_statement(q, "object", mine, "REPLACE"))


def write_shards(router: Router, token: FenceToken | None, rows: TargetRows,
                 threads: int = WRITE_THREADS,
                 held: dict[tuple[int, str], set[int]] | None = None) -> None:
    """Objects and mapping rows, fenced, in one transaction per group of shards on one
    server (``Router.server_groups``: one commit for up to ``GROUP_SHARDS`` shards), a few
    groups at a time. A group whose tables each get a few small rows (``_as_insert``: a
    chunk spread over thousands of shards) is pipelined: a few round trips in all.

    ``held``: per shard table, the slots the chunk's survey found held by their own row.
    The worker only waits on the servers here, so overlapping transactions (each on
    its own pooled connection) keeps the servers busy while one commits.
    """
    held = held or {}
    per_shard: dict[int, list[tuple[str, str, list]]] = defaultdict(list)
    for (shard, table), items in rows.objects.items():
        per_shard[shard].append((table, "object", items))
    for (shard, table), items in rows.mappings.items():
        per_shard[shard].append((table, "mapping", items))

    def one(cur: Cursor, shard: int) -> None:
        fencing.check(cur, shard, token)
        for table, kind, items in per_shard[shard]:
            if kind == "object":
                _load_objects(cur, shard, table, items, held.get((shard, table), set()))
            else:
                load_rows(cur, shard_table(shard, table), kind, items)

    def queued(pipe: Pipeline, shard: int) -> None:
        fencing.queue_check(pipe, shard, token)
        for table, kind, items in per_shard[shard]:
            if kind == "object":
                _queue_objects(pipe, shard, table, items, held.get((shard, table), set()))
            else:
                pipe.add(*_insert_statement(shard_table(shard, table), kind, items,
                                            "REPLACE"))

    def small(group: list[int]) -> bool:
        return all(_as_insert(kind, items) for s in group for _, kind, items in per_shard[s])
    groups = router.server_groups(list(per_shard), threads, GROUP_SHARDS)
    run_parallel([(partial(router.run_group, g, queued, pipelined=True),) if small(g) else
                  (partial(router.run_group, g, one, infile=True),)  # infile: the only
                  for g in groups], threads)                         # ones that send files


def _mod_statements(conn, b: int, table: str, rows: list[tuple]) -> list[str]:
    cols, tail = MOD_UPSERT[table]
    q = mod_table(b, table)
    rows = sorted(rows)
    parts = [rows[i:i + BATCH] for i in range(0, len(rows), BATCH)]
    if table == "legacy_id_map":  # three integers a row: one %-format in C, not a string each
        values = [",".join(["(%d,%d,%d)"] * len(p)) % tuple(chain.from_iterable(p))
                  for p in parts]
    else:
        values = [",".join(f"({conn.escape(key)},{int(uid)})" for key, uid in p) for p in parts]
    return [f"INSERT INTO {q} {cols} VALUES {v} {tail}" for v in values]


def write_mod(router: Router, rows: TargetRows, token: FenceToken | None = None) -> None:
    """Mod-shard lookups: per mod server, transactions of about ``MOD_TX_STATEMENTS``
    upserts, each fenced by ``token`` (``fencing.check_mod``), sent as one multi-statement
    round trip and retried on its own."""
    m = router.shardmap
    per_server: dict[tuple, list[tuple[int, str, list]]] = defaultdict(list)
    for (bucket, table), items in sorted(rows.lookups.items()):
        per_server[m.mod_master(bucket).server].append((bucket, table, items))
    for groups in per_server.values():
        for part in _by_statements(groups, MOD_TX_STATEMENTS):
            router.run_mod(part[0][0], partial(_upsert_lookups, m, token, part), multi=True)


def run_mod_statements(router: Router, statements: list[tuple[int, str, tuple]],
                       token: FenceToken | None = None) -> None:
    """Statements ``(bucket, sql, params)`` on mod buckets: per mod server, transactions of
    ``MOD_TX_STATEMENTS`` statements, each fenced by ``token`` and sent as one
    multi-statement round trip."""
    m = router.shardmap
    per_server: dict[tuple, list[tuple[int, str, tuple]]] = defaultdict(list)
    for st in statements:
        per_server[m.mod_master(st[0]).server].append(st)
    for group in per_server.values():
        for i in range(0, len(group), MOD_TX_STATEMENTS):
            part = group[i:i + MOD_TX_STATEMENTS]
            router.run_mod(part[0][0], partial(_multi, m, token, part), multi=True)


def _multi(m: ShardMap, token: FenceToken | None, part: list[tuple[int, str, tuple]],
           cur) -> None:
    fencing.check_mod(cur, m, [b for b, _, _ in part], token)
    _execute_all(cur, [cur.mogrify(sql, params) for _, sql, params in part])


def _execute_all(cur, sqls: list[str]) -> None:
    """Inside a transaction on a multi-statement connection: ``sqls`` in one round trip."""
    cur.execute(";\n".join(sqls))
    while cur.nextset():
        pass


def _by_statements(groups: list[tuple[int, str, list]], limit: int) -> list[list[tuple]]:
    """Consecutive runs of ``groups`` of at most ``limit`` statements (one if a group is more)."""
    out: list[list[tuple]] = [[]]
    n = 0
    for g in groups:
        cost = -(-len(g[2]) // BATCH)
        if out[-1] and n + cost > limit:
            out.append([])
            n = 0
        out[-1].append(g)
        n += cost
    return out if out[0] else []


def _upsert_lookups(m: ShardMap, token: FenceToken | None, groups: list[tuple[int, str, list]],
                    cur) -> None:
    """Inside one transaction: the fence checked, then every group's upserts as one
    multi-statement round trip."""
    fencing.check_mod(cur, m, [b for b, _, _ in groups], token)
    _execute_all(cur, [s for b, t, items in groups
                       for s in _mod_statements(cur.connection, b, t, items)])
