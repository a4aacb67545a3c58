"""The legacy write load and the lag sampler of ``benchmarks.sync_bench``.

``Load`` is the application writing to the legacy database (inserts, updates, moves and
cascading deletes, each statement its own transaction, every commit's GTID and time
recorded); ``Sampler`` samples, every 0.5 s, how far ``farm sync``'s checkpoint is
behind it, in transactions and in seconds.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pymysql

from benchmarks._bench import Bench
from loaders.migration.binlog import behind, parse

CONTROL = "farm_control"
SAMPLE_EVERY = 0.5


# --- the legacy write load -----------------------------------------------------------------


@dataclass
class Load:
    """The application writing to the legacy database: one connection, autocommitted
    statements (one transaction each), the GTID and time of every commit."""

    conn: pymysql.Connection
    rng: random.Random
    users: list[int]
    boards: list[tuple[int, int]]  # (board, owner)
    pins: list[int]
    next_id: int
    likes: list[tuple[int, int]] = field(default_factory=list)  # inserted here, to delete
    follows: list[tuple[int, int]] = field(default_factory=list)
    rows: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    commits: list[tuple[int, float]] = field(default_factory=list)  # (gtid seq, monotonic)
    cycle: int = 0

    @classmethod
    def open(cls, port: int, seed: int) -> Load:
        """Connect and read the keys the load picks from."""
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database="legacy",
                               autocommit=True, charset="utf8mb4")
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM users WHERE username IS NOT NULL")
            users = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT id, user_id FROM boards WHERE user_id IS NOT NULL")
            boards = [(r[0], r[1]) for r in cur.fetchall()]
            cur.execute("SELECT id FROM pins")
            pins = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT GREATEST((SELECT MAX(id) FROM pins WHERE id < 1 << 34),"
                        " (SELECT MAX(id) FROM boards WHERE id < 1 << 34))")
            top = int(cur.fetchone()[0] or 0)
        return cls(conn, random.Random(seed), users, boards, pins, top + 1_000_000)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def _run(self, kind: str, sql: str, args: Iterable = ()) -> int:
        with self.conn.cursor() as cur:
            n = cur.execute(sql, tuple(args))
            if n:
                cur.execute("SELECT @@last_gtid")
                gtid = cur.fetchone()[0]
                self.commits.append((parse(gtid)[0][1], time.monotonic()))
        self.rows += n
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n
        return n

    def _pick(self, items: list, k: int) -> list:
        return [self.rng.choice(items) for _ in range(k)]

    def _take(self, items: list, k: int) -> list:
        """Remove and return ``k`` random items (swap with the last: O(1) each)."""
        out = []
        for _ in range(min(k, len(items))):
            i = self.rng.randrange(len(items))
            items[i], items[-1] = items[-1], items[i]
            out.append(items.pop())
        return out

    def one_cycle(self) -> None:
        """About 80 row changes in 10-12 statements (each its own transaction)."""
        c = self.cycle
        self.cycle += 1
        now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        new = []
        for board, owner in self._pick(self.boards, 10):
            new.append((self.next_id, owner, board, f"live pin {c}", now))
            self.next_id += 1
        self._run("insert pins", "INSERT INTO pins (id, user_id, board_id, details, link, "
                  "image_url, created_at) VALUES " + ",".join(["(%s,%s,%s,%s,NULL,NULL,%s)"] * 10),
                  [v for row in new for v in row])
        self.pins.extend(p[0] for p in new)
        likes = list({(u, p) for u, p in zip(self._pick(self.users, 20),
                                             self._pick(self.pins, 20), strict=True)})
        self._run("insert likes", "INSERT IGNORE INTO likes (user_id, pin_id, created_at) "
                  "VALUES " + ",".join(["(%s,%s,%s)"] * len(likes)),
                  [v for u, p in likes for v in (u, p, now)])
        self.likes.extend(likes)
        follows = list({(u, b[0]) for u, b in zip(self._pick(self.users, 10),
                                                  self._pick(self.boards, 10), strict=True)})
        self._run("insert follows", "INSERT IGNORE INTO follows (user_id, board_id, created_at) "
                  "VALUES " + ",".join(["(%s,%s,%s)"] * len(follows)),
                  [v for u, b in follows for v in (u, b, now)])
        self.follows.extend(follows)
        ids = self._pick(self.users, 5)
        self._run("update users", "UPDATE users SET full_name = %s WHERE id IN "
                  f"({','.join(['%s'] * 5)})", [f"Live {c}", *ids])
        ids = self._pick(self.boards, 5)
        self._run("update boards", "UPDATE boards SET description = %s WHERE id IN "
                  f"({','.join(['%s'] * 5)})", [f"edited {c}", *(b for b, _ in ids)])
        ids = self._pick(self.pins, 10)
        self._run("update pins", "UPDATE pins SET details = %s WHERE id IN "
                  f"({','.join(['%s'] * 10)})", [f"edited {c}", *ids])
        (pin,), ((board, owner),) = self._pick(self.pins, 1), self._pick(self.boards, 1)
        self._run("move pin (cascades)", "UPDATE pins SET board_id = %s, user_id = %s "
                  "WHERE id = %s", (board, owner, pin))
        gone = self._take(self.likes, 10)
        self._run("delete likes", "DELETE FROM likes WHERE (user_id, pin_id) IN "
                  f"({','.join(['(%s,%s)'] * len(gone))})", [v for k in gone for v in k])
        gone = self._take(self.follows, 5)
        self._run("delete follows", "DELETE FROM follows WHERE (user_id, board_id) IN "
                  f"({','.join(['(%s,%s)'] * len(gone))})", [v for k in gone for v in k])
        gone = self._take(self.pins, 2)
        self._run("delete pins (cascade)", "DELETE FROM pins WHERE id IN (%s,%s)", gone)
        if c % 10 == 9:
            (board, _), = self._take(self.boards, 1)
            self._run("delete boards (cascade)", "DELETE FROM boards WHERE id = %s", (board,))
        if c % 50 == 49:
            user, = self._take(self.users, 1)
            self.boards = [b for b in self.boards if b[1] != user]
            self._run("delete users (cascade)", "DELETE FROM users WHERE id = %s", (user,))

    def paced(self, rate: float, seconds: float) -> float:
        """Cycles paced to ``rate`` row changes per second for ``seconds``; the seconds
        taken."""
        start = time.monotonic()
        first = self.rows
        while (t := time.monotonic() - start) < seconds:
            ahead = (self.rows - first) / rate - t
            if ahead > 0:
                time.sleep(min(ahead, seconds - t))
                continue
            self.one_cycle()
        return time.monotonic() - start

    def amount(self, rows: int) -> float:
        """Cycles as fast as they go until ``rows`` more row changes; the seconds taken."""
        start, until = time.monotonic(), self.rows + rows
        while self.rows < until:
            self.one_cycle()
        return time.monotonic() - start


# --- lag -----------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Samples the lag every 0.5 s in a thread: transactions behind and the age of the
    oldest commit not yet checkpointed."""

    bench: Bench
    legacy_port: int
    load: Load
    samples: list[tuple[float, int, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        control = self.bench.connect(database=CONTROL)
        legacy = pymysql.connect(host="127.0.0.1", port=self.legacy_port, user="root",
                                 autocommit=True)
        try:
            while not self.stop.wait(SAMPLE_EVERY):
                self.samples.append(sample(control, legacy, self.load.commits))
        finally:
            control.close()
            legacy.close()

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def sample(control: pymysql.Connection, legacy: pymysql.Connection,
           commits: list[tuple[int, float]]) -> tuple[float, int, float, int]:
    """(monotonic time, transactions behind, seconds behind, ``farm sync status``'s own
    lag_seconds)."""
    with legacy.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        server = cur.fetchone()[0] or ""
    with control.cursor() as cur:
        cur.execute("SELECT gtid, event_time FROM sync_state")
        gtid, event_time = cur.fetchone()
    now = time.monotonic()
    applied = parse(gtid or "").get(0, (0, 0))[1]
    lag = behind(gtid or "", server)
    i = bisect.bisect_right(commits, (applied, float("inf")))
    seconds = now - commits[i][1] if lag and i < len(commits) else 0.0
    status = 0 if lag == 0 or not event_time else max(0, int(time.time()) - int(event_time))
    return now, lag, seconds, status


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    s = sorted(values)
    return s[max(0, -(-len(s) * 95 // 100) - 1)] if s else 0.0
