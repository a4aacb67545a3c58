"""New 64-bit IDs for legacy rows.

A legacy ID below 2**36 becomes the local ID on the row's shard, so the new ID
is a pure function of the legacy data. A larger legacy ID gets a local ID from
the shard's AUTO_INCREMENT (raised above every small legacy ID first, so the two
never collide) and ``legacy_id_map`` remembers it: whoever needs it first
(the row's own chunk or a chunk that references it) allocates it, and a race is
settled by the mod-shard primary key, the loser giving its placeholder back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from loaders.legacy import SMALL_LIMIT
from loaders.spec import LegacyTable
from sharding import ids
from sharding.modshard import bucket_of, legacy_key
from sharding.router import Router
from sharding.schema import mod_table, shard_table

MAX_CACHE = 2_000_000
_TYPE_IDS = ids.TYPES
UNION_BUCKETS = 200


def fits(legacy: int) -> bool:
    """Whether a legacy ID can be the local ID itself (1 <= id < 2**36)."""
    return 0 < legacy < SMALL_LIMIT


class NewIds:
    """Resolves legacy IDs to new IDs; big-ID answers are cached for the process's life."""

    def __init__(self, router: Router, floors: dict[str, int]) -> None:
        self.router = router
        self.floors = floors
        self.cache: dict[tuple[int, int], int] = {}
        self._floored: set[tuple[int, str]] = set()

    def known(self, table: LegacyTable, legacy: int) -> bool:
        """Whether ``new_id`` can answer for this legacy ID."""
        return fits(legacy) or (ids.TYPES[table.type_name], legacy) in self.cache

    def new_id(self, table: LegacyTable, legacy: int, shard: int) -> int:
        """The new ID of a legacy object (``prepare`` must have seen it if it is big).

        Hot path: the parts are in range by construction (shard from the map, type
        from the spec, 1 <= legacy < 2**36), so the ID is composed directly.
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
        big = {k: v for k, v in big.items() if k not in self.cache}
        if not big:
            return
        if len(self.cache) > MAX_CACHE:
            self.cache.clear()
        self.cache.update(self._lookup(big.keys()))
        if not allocate:
            return
        for key, (tbl, shard) in big.items():
            if key not in self.cache:
                self.cache[key] = self._allocate(tbl, shard, key[1])

    def _bucket(self, type_id: int, legacy: int) -> int:
        key = legacy_key(ids.TYPE_NAMES[type_id], legacy)
        return bucket_of(key, self.router.shardmap.buckets)

    def _lookup(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        by_server: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        m = self.router.shardmap
        for t, legacy in keys:
            b = self._bucket(t, legacy)
            by_server[m.mod_master(b).server][b].append((t, legacy))
        found: dict[tuple[int, int], int] = {}
        for buckets in by_server.values():
            items = sorted(buckets.items())
            for i in range(0, len(items), UNION_BUCKETS):
                found.update(self._select(items[i:i + UNION_BUCKETS]))
        return found

    def _select(self, items: list[tuple[int, list]]) -> dict[tuple[int, int], int]:
        parts, params = [], []
        for b, pairs in items:
            marks = ",".join(["(%s,%s)"] * len(pairs))
            parts.append(f"SELECT type_id, legacy_id, new_id FROM {mod_table(b, 'legacy_id_map')}"
                         f" WHERE (type_id, legacy_id) IN ({marks})")
            params += [v for p in pairs for v in p]

        def select(cur) -> list[tuple]:
            cur.execute(" UNION ALL ".join(parts), params)
            return cur.fetchall()
        rows = self.router.run_mod(items[0][0], select)
        return {(t, legacy): new for t, legacy, new in rows}

    def _allocate(self, table: LegacyTable, shard: int, legacy: int) -> int:
        t = ids.TYPES[table.type_name]
        q = shard_table(shard, table.name)
        self._raise_floor(shard, table)
        local = self.router.run(shard, lambda cur: (cur.execute(
            f"INSERT INTO {q} (data, active) VALUES ('{{}}', 0)"), cur.lastrowid)[1])
        mine = ids.encode(shard, t, local)
        b = self._bucket(t, legacy)
        mq = mod_table(b, "legacy_id_map")

        def claim(cur) -> int:
            cur.execute(f"INSERT IGNORE INTO {mq} (type_id, legacy_id, new_id) VALUES (%s,%s,%s)",
                        (t, legacy, mine))
            cur.execute(f"SELECT new_id FROM {mq} WHERE type_id = %s AND legacy_id = %s",
                        (t, legacy))
            return cur.fetchone()[0]
        winner = self.router.run_mod(b, claim)
        if winner != mine:  # another chunk allocated first: give the placeholder back
            self.router.run(shard, lambda cur: cur.execute(
                f"DELETE FROM {q} WHERE local_id = %s AND active = 0", (local,)))
        return winner

    def _raise_floor(self, shard: int, table: LegacyTable) -> None:
        """Make the shard's AUTO_INCREMENT start above every small legacy ID (once per process)."""
        if (shard, table.name) in self._floored:
            return
        floor = int(self.floors.get(table.name, 0)) + 1
        q = shard_table(shard, table.name)
        self.router.run(shard, lambda cur: cur.execute(f"ALTER TABLE {q} AUTO_INCREMENT = {floor}"))
        self._floored.add((shard, table.name))
