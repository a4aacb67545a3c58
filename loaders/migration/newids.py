"""New 64-bit IDs for legacy rows.

A legacy ID below 2**35 becomes the local ID on the row's shard, so the new ID
is a pure function of the legacy data. A larger legacy ID (or 0) gets a local ID
from the shard's AUTO_INCREMENT, which hands out only 2**35 and above (local IDs
below 2**35 are reserved for legacy IDs, ``sharding.slots``), so the two halves
never meet whatever the legacy data holds now or later; ``legacy_id_map``
remembers it: whoever needs it first (the row's own chunk or a chunk that
references it) allocates it, and a race is settled by the mod-shard primary key,
the loser giving its placeholder back. Allocation is batched: one statement per
shard table, one round trip per run of mod buckets.

A ``NewIds`` lives for one chunk and routes with that chunk's router; what it
learnt (big legacy ID -> new ID, immutable once recorded) is kept in a cache the
process's later chunks share.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Iterable
from functools import partial

import orjson

from loaders.migration import retire
from loaders.migration.spec import LegacyTable
from sharding import fencing, ids
from sharding.fencing import FenceToken
from sharding.modshard import bucket_of, legacy_key
from sharding.router import Router
from sharding.schema import mod_table, shard_table
from sharding.shardmap import ShardMap
from sharding.slots import insert_allocated

MAX_CACHE = 2_000_000
_TYPE_IDS = ids.TYPES
UNION_BUCKETS = 200
SMALL_LIMIT = ids.FIRST_ALLOCATED
IdCache = dict[tuple[int, int], int]


def fits(legacy: int) -> bool:
    """Whether a legacy ID is the local ID itself (1 <= id < 2**35)."""
    return 0 < legacy < SMALL_LIMIT


class NewIds:
    """Resolves legacy IDs to new IDs through ``router`` (one chunk's); big-ID answers go
    to ``cache``, which may outlive it (a process passes the same one to every chunk).
    What it records and retires is fenced by ``token`` (the chunk's)."""

    def __init__(self, router: Router, cache: IdCache | None = None,
                 token: FenceToken | None = None) -> None:
        self.router = router
        self.cache: IdCache = {} if cache is None else cache
        self.token = token

    def known(self, table: LegacyTable, legacy: int) -> bool:
        """Whether ``new_id`` can answer for this legacy ID."""
        return fits(legacy) or (ids.TYPES[table.type_name], legacy) in self.cache

    def new_id(self, table: LegacyTable, legacy: int, shard: int) -> int:
        """The new ID of a legacy object (``prepare`` must have seen it if it is big).

        Hot path: the parts are in range by construction (shard from the map, type
        from the spec, 1 <= legacy < 2**35), so the ID is composed directly.
        """
        t = _TYPE_IDS[table.type_name]
        if 0 < legacy < SMALL_LIMIT:
            return (shard << ids.SHARD_SHIFT) | (t << ids.TYPE_SHIFT) | legacy
        return self.cache[(t, legacy)]

    def prepare(self, wanted: Iterable[tuple[LegacyTable, int, int]],
                allocate: bool = True) -> None:
        """Look up (or allocate) every big legacy ID among ``(table, legacy_id, shard)``.

        With ``allocate=False`` (verify) nothing is written; unknown IDs stay unknown.
        """
        big = {(ids.TYPES[tbl.type_name], legacy): (tbl, shard) for tbl, legacy, shard in wanted
               if not fits(legacy)}
        big = {k: v for k, v in big.items() if not self._placed(k, v[1])}
        if not big:
            return
        if len(self.cache) > MAX_CACHE:
            self.cache.clear()
        self.cache.update(self._lookup(big.keys()))
        # an ID on another shard than the row's placement now (its board moved): a new one
        todo = {k: v for k, v in big.items() if not self._placed(k, v[1])}
        if allocate and todo:
            self._retire_moved(todo)
            self.cache.update(self._allocate(todo))

    def _retire_moved(self, todo: dict[tuple[int, int], tuple[LegacyTable, int]]) -> None:
        """Retire the old slots of big legacy IDs about to get a new ID on another shard.
        Before the new ID is recorded, not after: ``legacy_id_map`` is the only way to a big
        ID's slot, so a process killed between the two would leave an active old slot that
        nothing leads to; this way the map still names it, and the next attempt retires it
        (again: retiring is idempotent)."""
        by_table: dict[str, tuple[LegacyTable, dict[int, int]]] = {}
        for key, (tbl, _) in todo.items():
            if key in self.cache:
                by_table.setdefault(tbl.name, (tbl, {}))[1][self.cache[key]] = key[1]
        for tbl, objects in by_table.values():
            retire.moved(self.router, self.token, tbl, objects)

    def _placed(self, key: tuple[int, int], shard: int) -> bool:
        """Whether the cache knows the big legacy ID ``key`` on ``shard``."""
        got = self.cache.get(key)
        return got is not None and got >> ids.SHARD_SHIFT == shard

    def _bucket(self, type_id: int, legacy: int) -> int:
        key = legacy_key(ids.TYPE_NAMES[type_id], legacy)
        return bucket_of(key, self.router.shardmap.buckets)

    def _by_bucket(self, keys: Iterable[tuple[int, int]]) -> list[list[tuple[int, list]]]:
        """Keys grouped by mod bucket, in runs of ``UNION_BUCKETS`` buckets on one server."""
        buckets: dict[int, list] = defaultdict(list)
        for t, legacy in keys:
            buckets[self._bucket(t, legacy)].append((t, legacy))
        return [[(b, buckets[b]) for b in group]
                for group in self.router.mod_groups(buckets, most=UNION_BUCKETS)]

    def _lookup(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        found: dict[tuple[int, int], int] = {}
        for run in self._by_bucket(keys):
            found.update(self.router.run_mod(run[0][0], partial(_recorded, run)))
        return found

    def _allocate(self, todo: dict[tuple[int, int], tuple[LegacyTable, int]]
                  ) -> dict[tuple[int, int], int]:
        """New IDs for ``(type_id, legacy_id)`` keys nobody recorded yet.

        Placeholder rows are inserted per shard table in one statement each, then
        claimed in ``legacy_id_map`` (``INSERT IGNORE``): where another chunk recorded an
        ID first, its ID wins and our placeholder is deleted again.
        """
        groups: dict[tuple[int, LegacyTable], list[tuple[int, int]]] = defaultdict(list)
        for key, (tbl, shard) in sorted(todo.items()):
            groups[(shard, tbl)].append(key)
        mine: dict[tuple[int, int], int] = {}
        for (shard, tbl), keys in groups.items():
            for key, local in zip(keys, self._placeholders(shard, tbl, len(keys)), strict=True):
                mine[key] = ids.encode(shard, key[0], local)
        won: dict[tuple[int, int], int] = {}
        for run in self._by_bucket(mine):
            won.update(self.router.run_mod(run[0][0], partial(
                _claim, self.router.shardmap, self.token, run, mine), multi=True))
        lost: dict[tuple[int, str], list[int]] = defaultdict(list)
        for key, new in mine.items():
            if won[key] != new:
                tbl, shard = todo[key]
                lost[(shard, tbl.name)].append(new & ids.MAX_LOCAL)
        for (shard, name), locals_ in lost.items():
            self._give_back(shard, name, locals_)
        return won

    def _placeholders(self, shard: int, table: LegacyTable, n: int) -> list[int]:
        """Local IDs (2**35 and above) of ``n`` new inactive rows.

        The rows carry a marker of their own, so they are found again whatever
        ``innodb_autoinc_lock_mode`` interleaved.
        """
        q = shard_table(shard, table.name)
        marker = orjson.dumps({"allocating": secrets.token_hex(8)}).decode()

        def insert(cur) -> list[int]:
            cur.execute(f"INSERT INTO {q} (data, active) VALUES "
                        + ",".join(["(%s, 0)"] * n), [marker] * n)
            cur.execute(f"SELECT local_id FROM {q} WHERE local_id >= %s AND data = %s "
                        "ORDER BY local_id", (cur.lastrowid, marker))
            return [r[0] for r in cur.fetchall()]
        return insert_allocated(self.router, shard, table.name, insert)

    def _give_back(self, shard: int, name: str, locals_: list[int]) -> None:
        """Delete placeholder rows (never a migrated, active row)."""
        q = shard_table(shard, name)
        marks = ",".join(["%s"] * len(locals_))
        self.router.run(shard, lambda cur: cur.execute(
            f"DELETE FROM {q} WHERE local_id IN ({marks}) AND active = 0", locals_))


def _recorded(run: list[tuple[int, list]], cur) -> dict[tuple[int, int], int]:
    """``legacy_id_map`` entries of the keys in ``run`` (one ``UNION ALL`` read)."""
    parts, params = [], []
    for b, pairs in run:
        marks = ",".join(["(%s,%s)"] * len(pairs))
        parts.append(f"SELECT type_id, legacy_id, new_id FROM {mod_table(b, 'legacy_id_map')}"
                     f" WHERE (type_id, legacy_id) IN ({marks})")
        params += [v for p in pairs for v in p]
    cur.execute(" UNION ALL ".join(parts), params)
    return {(t, legacy): new for t, legacy, new in cur.fetchall()}


def _claim(m: ShardMap, token: FenceToken | None, run: list[tuple[int, list]],
           mine: dict[tuple[int, int], int], cur) -> dict[tuple[int, int], int]:
    """Record ``mine`` where nothing is recorded yet, or where the recorded ID is on
    another shard (the row was placed elsewhere since), once ``token`` passed the fence;
    return what is recorded now."""
    fencing.check_mod(cur, m, [b for b, _ in run], token)
    cur.execute(";".join(
        f"INSERT INTO {mod_table(b, 'legacy_id_map')} (type_id, legacy_id, new_id) "
        "VALUES " + ",".join(f"({int(t)},{int(legacy)},{int(mine[(t, legacy)])})"
                             for t, legacy in pairs)
        + f" ON DUPLICATE KEY UPDATE new_id = IF(new_id >> {ids.SHARD_SHIFT} = "
          f"VALUES(new_id) >> {ids.SHARD_SHIFT}, new_id, VALUES(new_id))"
        for b, pairs in run))
    while cur.nextset():
        pass
    return _recorded(run, cur)
