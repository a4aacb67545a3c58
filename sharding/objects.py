"""Object store: one row per object, a JSON document and an ``active`` flag, on its ID's shard."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shardfarm.errors import FatalError, NotFoundError
from sharding import ids
from sharding.jsondoc import dumps, loads
from sharding.router import Router
from sharding.schema import TABLE_OF_TYPE, shard_table
from sharding.slots import insert_allocated


@dataclass(frozen=True)
class StoredObject:
    """An object read from its shard."""

    id: int
    shard: int
    type: int
    local_id: int
    data: dict
    active: bool


@dataclass
class GetManyResult:
    """Objects found, in the requested order, and the IDs that were missing."""

    found: list[StoredObject] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    def by_id(self) -> dict[int, StoredObject]:
        """Found objects keyed by ID."""
        return {o.id: o for o in self.found}


def _table(type_: int) -> str:
    try:
        return TABLE_OF_TYPE[type_]
    except KeyError:
        raise FatalError(f"no object table for type {type_}") from None


class ObjectStore:
    """Create, read, update and soft-delete objects through the router."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def create(self, shard: int, type_: int | str, data: dict) -> int:
        """Insert a new object on ``shard``; the shard's AUTO_INCREMENT assigns the local ID,
        always from 2**35 up (below are legacy IDs' own slots)."""
        t = ids.type_id(type_)
        q = shard_table(shard, _table(t))

        def insert(cur) -> list[int]:
            cur.execute(f"INSERT INTO {q} (data) VALUES (%s)", (dumps(data),))
            return [cur.lastrowid]
        (local,) = insert_allocated(self.router, shard, _table(t), insert)
        return ids.encode(shard, t, local)

    def get(self, id_: int, include_inactive: bool = False) -> StoredObject:
        """One object, or ``NotFoundError``."""
        res = self.get_many([id_], include_inactive)
        if res.missing:
            raise NotFoundError(f"object {id_} not found")
        return res.found[0]

    def get_many(self, id_list: Iterable[int], include_inactive: bool = False) -> GetManyResult:
        """Multi-get: one query per shard, results in the requested order, missing reported."""
        wanted = [ids.decode(i) for i in id_list]
        by_shard: dict[int, list[ids.DecodedId]] = defaultdict(list)
        for d in wanted:
            by_shard[d.shard].append(d)
        rows: dict[int, StoredObject] = {}
        for shard, group in by_shard.items():
            rows.update(self._fetch_shard(shard, group))
        res = GetManyResult()
        for d in wanted:
            obj = rows.get(d.id)
            if obj is None or not (obj.active or include_inactive):
                res.missing.append(d.id)
            else:
                res.found.append(obj)
        return res

    def _fetch_shard(self, shard: int, group: list[ids.DecodedId]) -> dict[int, StoredObject]:
        by_type: dict[int, list[int]] = defaultdict(list)
        for d in group:
            by_type[d.type].append(d.local)
        parts, params = [], []
        for t, locals_ in sorted(by_type.items()):
            marks = ",".join(["%s"] * len(locals_))
            parts.append(f"SELECT {t}, local_id, data, active FROM {shard_table(shard, _table(t))}"
                         f" WHERE local_id IN ({marks})")
            params += locals_
        sql = " UNION ALL ".join(parts)

        def select(cur) -> list[tuple]:
            cur.execute(sql, params)
            return cur.fetchall()
        out = {}
        for t, local, data, active in self.router.run(shard, select):
            oid = ids.encode(shard, t, local)
            out[oid] = StoredObject(oid, shard, t, local, loads(data), bool(active))
        return out

    def update(self, id_: int, change: Callable[[dict], dict | None]) -> dict:
        """Read-modify-write in one transaction (``SELECT … FOR UPDATE``); returns the new data.

        ``change`` receives the current document and returns the new one (or edits it
        in place and returns ``None``). The whole transaction is retried on deadlock.
        """
        d = ids.decode(id_)
        q = shard_table(d.shard, _table(d.type))

        def rmw(cur) -> dict:
            cur.execute(f"SELECT data FROM {q} WHERE local_id = %s AND active = 1 FOR UPDATE",
                        (d.local,))
            row = cur.fetchone()
            if row is None:
                raise NotFoundError(f"object {id_} not found")
            doc = loads(row[0])
            new = change(doc)
            doc = doc if new is None else new
            cur.execute(f"UPDATE {q} SET data = %s WHERE local_id = %s", (dumps(doc), d.local))
            return doc
        return self.router.run(d.shard, rmw)

    def set_active(self, id_: int, active: bool) -> bool:
        """Soft delete (``active=False``) or restore; returns whether the object exists."""
        d = ids.decode(id_)
        q = shard_table(d.shard, _table(d.type))

        def flip(cur) -> bool:
            cur.execute(f"UPDATE {q} SET active = %s WHERE local_id = %s", (int(active), d.local))
            cur.execute(f"SELECT 1 FROM {q} WHERE local_id = %s", (d.local,))
            return cur.fetchone() is not None
        return self.router.run(d.shard, flip)

    def delete(self, id_: int) -> bool:
        """Soft-delete an object (``active = 0``)."""
        return self.set_active(id_, False)
