"""``farm feeds rebuild``: rebuild Redis home feeds from the mapping tables.

A user's home feed (``home:<user_id>``) is the pins of the boards they follow
(``user_follows_boards`` on the user's shard), newest first by the pin's
``sequence`` in ``board_has_pins`` (on the board's shard), ties broken by pin ID
descending, each pin once, at most ``length`` pins. A chunk is a range of local
user IDs on one shard (or an explicit list of users). It reads follows and the
newest ``length`` pins of every followed board in batched queries, merges them
per user, and swaps the feeds in with one atomic Lua script per batch of users, so a
reader sees the old feed or the new one, never a half-built one. The swap is fenced in
Redis (``loaders.feedswap``): a chunk's stalled earlier owner is refused (the ledger has
the last word), and no feed is replaced by one read before it. Running a chunk twice leaves
the same feeds.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Outcome
from loaders.feedswap import begin, swap_feeds
from shardfarm.errors import ConfigError, InvalidIdError, UsageError
from shardfarm.mysql.inlist import IN_LIST_MAX
from sharding import ids
from sharding.router import Router
from sharding.schema import shard_table

HANDLER = "loaders.feeds.rebuild_chunk"
KIND = "feeds"
DEFAULT_LENGTH = 500
MAX_LENGTH = 10_000
DEFAULT_CHUNK_USERS = 2000
USER_BATCH = IN_LIST_MAX  # users per read round (one IN list of follows a shard)
BOARD_BATCH = 200      # boards per window-function query
CACHE_PINS = 2_000_000  # board pins kept across read rounds of one chunk

Entry = tuple[int, int]  # (sequence, pin_id): sorts like the feed, descending


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _by_shard(id_list: Iterable[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i in id_list:
        out[ids.shard_of(i)].append(i)
    return out


def _marks(n: int) -> str:
    return ",".join(["%s"] * n)


# -- planning ---------------------------------------------------------------------------
def check_user_ids(user_ids: Iterable[int]) -> list[int]:
    """Distinct user IDs in their given order; ``InvalidIdError`` for any other ID."""
    out: dict[int, None] = {}
    for u in user_ids:
        if ids.decode(u).type != ids.TYPES["user"]:
            raise InvalidIdError(f"{u} is not a user ID (it is a {ids.decode(u).type_name})")
        out[u] = None
    if not out:
        raise InvalidIdError("no user IDs given")
    return list(out)


def user_ranges(router: Router, shard: int, chunk_users: int) -> list[tuple[int, int, int]]:
    """Contiguous ``(lo, hi, users)`` local-ID ranges covering a shard's active users,
    ~``chunk_users`` each; the last range is open-ended so users created since planning are
    rebuilt too."""
    sql = (f"SELECT MAX(local_id), COUNT(*) FROM (SELECT local_id, (ROW_NUMBER() OVER "
           f"(ORDER BY local_id) - 1) DIV %s AS grp FROM {shard_table(shard, 'users')} "
           "WHERE active = 1) t GROUP BY grp ORDER BY grp")
    groups = router.query(router.host_for(shard), sql, (chunk_users,), shard)
    if not groups:
        return []
    ends = [g[0] for g in groups]
    ends[-1] = ids.MAX_LOCAL
    return list(zip([1, *(e + 1 for e in ends[:-1])], ends, [int(g[1]) for g in groups],
                    strict=True))


def plan(router: Router, chunk_users: int = DEFAULT_CHUNK_USERS, length: int = DEFAULT_LENGTH,
         users: Iterable[int] | None = None) -> tuple[dict, list[ChunkSpec]]:
    """Run parameters and chunks: one chunk of ``users``, or user ranges of every shard."""
    if chunk_users < 1:
        raise UsageError(f"--chunk-size must be at least 1, got {chunk_users}")
    if not 1 <= length <= MAX_LENGTH:
        raise UsageError(f"--length must be in 1..{MAX_LENGTH}, got {length}")
    params = {"length": length, "chunk_users": chunk_users, "kinds": [KIND]}
    if users is not None:
        users = check_user_ids(users)
        held = set(router.shardmap.shards())
        if away := next((u for u in users if ids.decode(u).shard not in held), None):
            raise UsageError(f"--users: user {away} is on shard {ids.decode(away).shard}, "
                             "which the shard map does not hold")
        return params, [ChunkSpec(KIND, {"users": users}, rows=len(users))]
    chunks = [ChunkSpec(KIND, {"shard": s, "lo": lo, "hi": hi}, rows=n)
              for s in router.shardmap.shards()
              for lo, hi, n in user_ranges(router, s, chunk_users)]
    return params, chunks


# -- reading ----------------------------------------------------------------------------
def active_users(router: Router, shard: int, lo: int, hi: int) -> list[int]:
    """IDs of the active users with local IDs ``lo..hi`` on ``shard``, ascending."""
    rows = router.query(router.host_for(shard),
                        f"SELECT local_id FROM {shard_table(shard, 'users')} "
                        "WHERE local_id BETWEEN %s AND %s AND active = 1 ORDER BY local_id",
                        (lo, hi), shard)
    return [ids.encode(shard, "user", r[0]) for r in rows]


def follows(router: Router, users: Sequence[int]) -> dict[int, list[int]]:
    """Boards each user follows: one ``IN`` query per shard."""
    out: dict[int, list[int]] = defaultdict(list)
    for shard, group in _by_shard(users).items():
        rows = router.query(router.host_for(shard),
                            f"SELECT from_id, to_id FROM "
                            f"{shard_table(shard, 'user_follows_boards')} "
                            f"WHERE from_id IN ({_marks(len(group))})", group, shard)
        for user, board in rows:
            out[user].append(board)
    return out


def newest_pins(router: Router, boards: Iterable[int], length: int) -> dict[int, list[Entry]]:
    """The newest ``length`` ``(sequence, pin)`` of each board, newest first: one
    window-function query per shard and batch of ``BOARD_BATCH`` boards."""
    out: dict[int, list[Entry]] = {}
    for shard, group in _by_shard(boards).items():
        q = shard_table(shard, "board_has_pins")
        for batch in _batches(sorted(group), BOARD_BATCH):
            sql = (f"SELECT from_id, to_id, sequence FROM (SELECT from_id, to_id, sequence, "
                   "ROW_NUMBER() OVER (PARTITION BY from_id ORDER BY sequence DESC, "
                   f"to_id DESC) AS rn FROM {q} WHERE from_id IN ({_marks(len(batch))})) t "
                   "WHERE rn <= %s ORDER BY from_id, rn")
            for board, pin, seq in router.query(router.host_for(shard), sql,
                                                [*batch, length], shard):
                out.setdefault(board, []).append((seq, pin))
    return out


class BoardPins:
    """Newest pins per board, fetched once per chunk while they fit in ``CACHE_PINS``."""

    def __init__(self, router: Router, length: int) -> None:
        self.router, self.length = router, length
        self.boards: dict[int, list[Entry]] = {}
        self.size = 0

    def load(self, boards: set[int]) -> None:
        """Make sure every board of ``boards`` is present (a board without pins maps to [])."""
        if self.size > CACHE_PINS:
            self.boards, self.size = {}, 0
        missing = [b for b in boards if b not in self.boards]
        fetched = newest_pins(self.router, missing, self.length)
        for b in missing:
            entries = fetched.get(b, [])
            self.boards[b] = entries
            self.size += len(entries) + 1


# -- merging and writing ----------------------------------------------------------------
def merge_feed(lists: Iterable[list[Entry]], length: int) -> list[int]:
    """Merge newest-first ``(sequence, pin)`` lists into at most ``length`` distinct pins."""
    out: list[int] = []
    seen: set[int] = set()
    for _seq, pin in heapq.merge(*lists, reverse=True):
        if pin not in seen:
            seen.add(pin)
            out.append(pin)
            if len(out) >= length:
                break
    return out


def rebuild_chunk(ctx: ChunkContext, users: list[int] | None = None, shard: int | None = None,
                  lo: int | None = None, hi: int | None = None) -> Outcome:
    """Chunk handler: rebuild the feeds of ``users``, or of the active users ``lo..hi`` of
    ``shard``."""
    if ctx.redis is None:
        raise ConfigError("the feeds handler needs Redis")
    length = int(ctx.params.get("length", DEFAULT_LENGTH))
    fence = begin(ctx.redis, ctx.token, ctx.fence)  # before anything is read: its generation
    if users is None:
        users = active_users(ctx.router, shard, lo, hi)
    cache = BoardPins(ctx.router, length)
    written = pins = superseded = 0
    for group in _batches(users, USER_BATCH):
        ctx.check()
        followed = follows(ctx.router, group)
        cache.load({b for bs in followed.values() for b in bs})
        feeds = {u: merge_feed([cache.boards[b] for b in followed.get(u, ())], length)
                 for u in group}
        ctx.check()
        done = swap_feeds(ctx.redis, feeds, fence)
        pins, written = pins + done.pins, written + done.feeds
        superseded += done.superseded
    return Outcome(rows_read=len(users), rows_written=written,
                   counts={"pins": pins, "superseded": superseded})
