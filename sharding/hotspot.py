"""Hot mappings spread over several shards, found through a directory table.

A board followed by millions overloads its shard. ``board_followedby_user_shard``
on the board's shard lists, per hot board, the shards that each hold a subset
of its ``board_followedby_users`` rows, and the state of its rebalance:

- ``planned`` / ``copying``: the home shard still holds every row and is what
  readers use; writers write home *and* the row's new shard.
- ``active``: the listed shards hold every row; readers fan out to them.
- ``cleaned``: the home shard's copies are gone.

A follower's shard is a pure function of the user ID and the listed shards,
the same for the rebalance, the reverse rebuild and the write path. The home
shard is never listed, so a reader never sees a row twice: an entry that lists it
(forged or corrupted) is refused wherever the directory is read or written
(``ListedHomeError``), never served as a duplicate.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardfarm.errors import FatalError, StaleStateError
from sharding import fencing, ids
from sharding.fencing import FenceToken
from sharding.mappings import Edge, Page, decode_cursor, encode_cursor
from sharding.router import Router
from sharding.schema import shard_table

DIRECTORY = "board_followedby_user_shard"
FOLLOWERS = "board_followedby_users"
STATES = ("planned", "copying", "active", "cleaned")
SPREAD_STATES = ("active", "cleaned")
TRANSITIONS = {("planned", "copying"), ("copying", "active"), ("active", "cleaned")}


class ListedHomeError(FatalError):
    """A hot board's directory entry lists the board's home shard (written by hand or
    corrupted): readers would see its rows twice and a cleanup would delete listed rows, so
    nothing reads or writes through it until an operator repairs the rows."""


@dataclass(frozen=True)
class Entry:
    """A hot board's directory entry: its state and the shards holding its rows."""

    board_id: int
    state: str
    shards: tuple[int, ...]

    @property
    def spread(self) -> bool:
        """Whether readers use the listed shards (else the home shard)."""
        return self.state in SPREAD_STATES


def _refuse_home(board_id: int, shards: Iterable[int]) -> None:
    """``ListedHomeError`` in one line naming the table, the board and its home shard, if
    ``shards`` (a board's listed shards) name its home shard."""
    home = ids.shard_of(board_id)
    if home in shards:
        raise ListedHomeError(
            f"{DIRECTORY} on shard {home}: hot board {board_id} lists its own home shard "
            f"{home} (its readers would see rows twice); repair its rows there")


def _entry(board_id: int, rows: list[tuple[int, str]]) -> Entry:
    """The entry of a board's ``(shard, state)`` directory rows (at least one); refused
    (``_refuse_home``) if they list its home shard."""
    shards = tuple(shard for shard, _ in rows)
    _refuse_home(board_id, shards)
    return Entry(board_id, rows[0][1], shards)


def follower_shard(user_id: int, shards: tuple[int, ...]) -> int:
    """Which of a hot board's shards holds the row of ``user_id``."""
    h = int.from_bytes(hashlib.md5(str(user_id).encode()).digest()[:8], "big")
    return sorted(shards)[h % len(shards)]


def choose_shards(router: Router, board_id: int, k: int) -> tuple[int, ...]:
    """``k`` shards other than the board's home, round-robin over master hosts."""
    home = ids.shard_of(board_id)
    m = router.shardmap
    per_server: dict[tuple, list[int]] = {}
    for s in m.shards():
        if s != home:
            per_server.setdefault(m.master(s).name, []).append(s)
    start = int.from_bytes(hashlib.md5(str(board_id).encode()).digest()[:4], "big")
    lists = [v[start % len(v):] + v[:start % len(v)] for _, v in sorted(per_server.items())]
    lists = lists[start % len(lists):] + lists[:start % len(lists)]
    out: list[int] = []
    while len(out) < k and any(lists):
        for lst in lists:
            if lst and len(out) < k:
                out.append(lst.pop(0))
    return tuple(sorted(out))


class Directory:
    """Reads and writes the hotspot directory on each board's home shard."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def get_many(self, board_ids: list[int]) -> dict[int, Entry]:
        """Entries of the boards that have one (one query per home shard)."""
        by_shard: dict[int, list[int]] = {}
        for b in set(board_ids):
            by_shard.setdefault(ids.shard_of(b), []).append(b)
        out: dict[int, Entry] = {}
        for shard, boards in by_shard.items():
            marks = ",".join(["%s"] * len(boards))
            rows = self.router.query(self.router.host_for(shard),
                                     f"SELECT board_id, shard, state FROM "
                                     f"{shard_table(shard, DIRECTORY)} WHERE board_id IN "
                                     f"({marks}) ORDER BY board_id, shard", boards, shard)
            for b in boards:
                mine = [(r[1], r[2]) for r in rows if r[0] == b]
                if mine:
                    out[b] = _entry(b, mine)
        return out

    def get(self, board_id: int) -> Entry | None:
        """The board's entry, or ``None`` if it is not hot."""
        return self.get_many([board_id]).get(board_id)

    def plan(self, board_id: int, shards: tuple[int, ...]) -> Entry:
        """Record a planned spread (keeps an existing entry as it is); ``shards`` must not
        name the board's home shard (``ListedHomeError``)."""
        home = ids.shard_of(board_id)
        q = shard_table(home, DIRECTORY)
        _refuse_home(board_id, shards)

        def tx(cur) -> None:
            cur.execute(f"SELECT COUNT(*) FROM {q} WHERE board_id = %s FOR UPDATE", (board_id,))
            if not cur.fetchone()[0]:
                cur.executemany(f"INSERT INTO {q} (board_id, shard, state) "
                                "VALUES (%s, %s, 'planned')", [(board_id, s) for s in shards])
        self.router.run(home, tx)
        return self.get(board_id)

    def transition(self, board_id: int, expected: str, new: str, token: FenceToken | None,
                   counts: dict[int, int] | None = None,
                   check: Callable[[object], None] | None = None) -> None:
        """Compare-and-set the board's state from ``expected`` to ``new`` on its home shard.

        One transaction: lock the entry, raise ``StaleStateError`` unless every row is in
        ``expected``, check the chunk's fence on the home shard, run ``check(cur)`` (which
        may raise to refuse the step), then ``UPDATE ... WHERE state = expected``. A stale
        actor's transition therefore fails instead of moving the board backwards.
        """
        if (expected, new) not in TRANSITIONS:
            raise ValueError(f"no transition {expected!r} -> {new!r}")
        home = ids.shard_of(board_id)
        q = shard_table(home, DIRECTORY)

        def tx(cur) -> None:
            cur.execute(f"SELECT DISTINCT state FROM {q} WHERE board_id = %s FOR UPDATE",
                        (board_id,))
            _expect(home, [r[0] for r in cur.fetchall()], expected)
            fencing.check(cur, home, token)
            if check:
                check(cur)
            n = cur.execute(f"UPDATE {q} SET state = %s WHERE board_id = %s AND state = %s",
                            (new, board_id, expected))
            if not n:
                _expect(home, [], expected)
            for shard, rows in (counts or {}).items():
                cur.execute(f"UPDATE {q} SET row_count = %s WHERE board_id = %s AND shard = %s",
                            (rows, board_id, shard))
        self.router.run(home, tx)


def _expect(home: int, states: list[str], expected: str) -> None:
    """Raise ``StaleStateError`` unless ``states`` is exactly ``[expected]``."""
    if states != [expected]:
        seen = ",".join(s if s in STATES else "?" for s in states) or "none"
        raise StaleStateError(f"hot board on shard {home}: directory state is {seen}, "
                              f"expected {expected}; a stale actor stops here")


def expect_state(cur, board_id: int, expected: str) -> None:
    """Inside a home-shard transaction: share-lock the board's entry and raise
    ``StaleStateError`` unless it is in ``expected`` (the lock holds it there until commit)."""
    entry = _entry_in(cur, board_id, lock=True)
    _expect(ids.shard_of(board_id), [entry.state] if entry else [], expected)


def _page_sql(shard: int, after: tuple[int, int] | None) -> tuple[str, list]:
    where, params = "from_id = %s", []
    if after:
        where += " AND (sequence < %s OR (sequence = %s AND to_id < %s))"
        params = [after[0], after[0], after[1]]
    return (f"SELECT from_id, to_id, sequence FROM {shard_table(shard, FOLLOWERS)} "
            f"WHERE {where} ORDER BY sequence DESC, to_id DESC LIMIT %s", params)


def _entry_in(cur, board_id: int, lock: bool = False) -> Entry | None:
    q = shard_table(ids.shard_of(board_id), DIRECTORY)
    cur.execute(f"SELECT shard, state FROM {q} WHERE board_id = %s ORDER BY shard"
                + (" LOCK IN SHARE MODE" if lock else ""), (board_id,))
    rows = cur.fetchall()
    return _entry(board_id, rows) if rows else None


def followers(router: Router, board_id: int, limit: int = 50, cursor: str | None = None) -> Page:
    """A page of a board's followers, newest first, honouring the hotspot directory.

    The directory and the home rows are read in one snapshot of the home shard,
    so a rebalance's cleanup can never delete rows under a reader that chose
    home; a hot board's listed shards are merged by ``(sequence, user ID)``
    descending. The keyset cursor stays valid across the switch to ``active``.
    """
    home = ids.shard_of(board_id)
    after = decode_cursor(cursor) if cursor else None
    sql, params = _page_sql(home, after)

    def snapshot(cur) -> tuple[Entry | None, list[Edge]]:
        entry = _entry_in(cur, board_id)
        if entry and entry.spread:
            return entry, []
        cur.execute(sql, [board_id, *params, limit + 1])
        return entry, [Edge(*r) for r in cur.fetchall()]
    entry, home_rows = router.run(home, snapshot)
    if entry and entry.spread:
        pages = []
        for s in entry.shards:
            sql_s, params_s = _page_sql(s, after)
            pages.append([Edge(*r) for r in router.query(
                router.host_for(s), sql_s, [board_id, *params_s, limit + 1], s)])
        merged = list(heapq.merge(*pages, key=lambda e: (e.sequence, e.to_id), reverse=True))
    else:
        merged = home_rows
    edges = merged[:limit]
    return Page(edges, encode_cursor(edges[-1]) if len(merged) > limit and edges else None)


def _upsert(cur, shard: int, board_id: int, user_id: int, sequence: int) -> None:
    cur.execute(f"INSERT INTO {shard_table(shard, FOLLOWERS)} (from_id, to_id, sequence) "
                "VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)",
                (board_id, user_id, sequence))


def lock_directory(cur, home: int) -> dict[int, Entry]:
    """Inside a home-shard transaction: share-lock the whole directory of ``home`` (its rows
    and gaps) and return its entries (``ListedHomeError`` if one lists ``home``). Until commit
    no board homed there can be planned or change state, so rows placed by ``place`` go
    where readers will look."""
    cur.execute(f"SELECT board_id, shard, state FROM {shard_table(home, DIRECTORY)} "
                "ORDER BY board_id, shard LOCK IN SHARE MODE")
    by_board: dict[int, list[tuple]] = defaultdict(list)
    for board, shard, state in cur.fetchall():
        by_board[board].append((shard, state))
    return {b: _entry(b, rs) for b, rs in by_board.items()}


def place(rows: Iterable[tuple[int, int, int]], entries: dict[int, Entry]
          ) -> tuple[list[tuple], dict[int, list[tuple]]]:
    """Split ``(board, user, seq)`` rows into home rows and rows per listed shard: a hot
    board's row goes to its follower shard, and home too while the board is not spread."""
    home: list[tuple] = []
    spread: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        entry = entries.get(row[0])
        if entry is not None:
            spread[follower_shard(row[1], entry.shards)].append(row)
        if entry is None or not entry.spread:
            home.append(row)
    return home, dict(spread)


def add_follower(router: Router, board_id: int, user_id: int, sequence: int) -> None:
    """The write path: add a follower row where readers of every state will find it.

    One home-shard transaction share-locks the board's directory entry (or its gap), so
    the board cannot be planned, flipped or cleaned until it commits; inside it, the row is
    first committed on its listed shard (if the board is hot), then written home (unless
    the board is spread), and the home commit comes last. A crash before that commit leaves
    at most a listed-shard row that no reader sees, which the flip's completeness check
    removes (``loaders.mappings.rebalance``); a crash after it leaves the row everywhere it belongs.
    """
    home = ids.shard_of(board_id)
    row = (board_id, user_id, sequence)

    def at_home(cur) -> None:
        entry = _entry_in(cur, board_id, lock=True)
        home_rows, spread = place([row], {board_id: entry} if entry else {})
        for shard in spread:
            router.run(shard, lambda c, s=shard: _upsert(c, s, *row))
        if home_rows:
            _upsert(cur, home, *row)
    router.run(home, at_home)
