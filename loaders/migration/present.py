"""What the target holds now for a selection of legacy keys (read only, never all of it).

A *selection* is a range of a legacy table's first key column (a chunk of ``farm
migrate``) or an explicit list of its values (the keys ``farm sync`` saw change). The
target is indexed by it without a scan of everything:

- an object whose legacy ID is below 2**35 sits at local ID = legacy ID on some shard:
  one index range (or ``IN`` list) per shard finds every active slot of the selection,
  wherever an earlier placement put it;
- ``legacy_id_map`` rows of the selection: an index range on ``(type_id, legacy_id)``
  in every bucket (a list selection reads only the buckets its keys hash to); they lead
  to the slots of legacy IDs of 2**35 and above;
- a link table's rows (follows, likes) live in the user's forward table on the user's
  shard; its users are found as above.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event

from loaders.migration.newids import SMALL_LIMIT, fits
from shardfarm.mysql.dsn import Host
from shardfarm.mysql.inlist import IN_LIST_MAX
from sharding import ids
from sharding.jsondoc import loads
from sharding.modshard import bucket_of, legacy_key
from sharding.router import Router
from sharding.schema import mod_table, shard_table

UNION_PARTS = 200
MAX_PARAMS = 20_000
IN_LIMIT = IN_LIST_MAX  # a longer IN list becomes a join that may scan the whole index


@dataclass(frozen=True)
class Selection:
    """Legacy first-key values ``lo..hi``, or exactly ``values`` when given; of a link
    table, with ``pairs``, only the rows of those whole keys (``values`` are their first
    columns)."""

    lo: int
    hi: int
    values: tuple[int, ...] | None = None
    pairs: frozenset[tuple[int, int]] | None = None
    mapped_only: bool = False

    @classmethod
    def of(cls, values: list[int], mapped_only: bool = False) -> Selection:
        """A selection of exactly these values; ``mapped_only``: objects whose active slot
        can only be where ``legacy_id_map`` places them (see ``held_objects``)."""
        v = tuple(sorted(set(values)))
        return cls(v[0] if v else 0, v[-1] if v else -1, v, mapped_only=mapped_only)

    @classmethod
    def of_pairs(cls, pairs: set[tuple[int, int]]) -> Selection:
        """A selection of exactly these two-column keys of a link table, every ID below
        2**35 (each is its own local ID: a held row names its key without a lookup)."""
        if not all(fits(a) and fits(b) for a, b in pairs):
            raise ValueError("a selection of pairs takes legacy IDs below 2**35 only")
        sel = cls.of([a for a, _ in pairs])
        return cls(sel.lo, sel.hi, sel.values, frozenset(pairs))

    def small(self) -> Selection | None:
        """The part below 2**35 (where legacy ID = local ID), or ``None`` if empty."""
        if self.values is not None:
            v = [x for x in self.values if fits(x)]
            return Selection.of(v) if v else None
        lo, hi = max(self.lo, 1), min(self.hi, SMALL_LIMIT - 1)
        return Selection(lo, hi) if lo <= hi else None

    def has_big(self) -> bool:
        """Whether the selection may hold legacy IDs that are not their own local ID."""
        if self.values is not None:
            return any(not fits(x) for x in self.values)
        return self.lo < 1 or self.hi >= SMALL_LIMIT

    def where(self, col: str) -> tuple[str, list]:
        """SQL condition and parameters selecting ``col`` in this selection."""
        if self.values is None:
            return f"{col} BETWEEN %s AND %s", [self.lo, self.hi]
        return f"{col} IN ({','.join(['%s'] * len(self.values))})", list(self.values)


@dataclass
class Held:
    """What the target holds for a selection of one object table: active slots
    (new ID -> ``(legacy_id, document)``) and ``legacy_id_map`` rows (legacy -> new ID)."""

    slots: dict[int, tuple[int, dict]] = field(default_factory=dict)
    mapped: dict[int, int] = field(default_factory=dict)

    def empty(self) -> bool:
        """Whether the target holds nothing for the selection (a first load)."""
        return not self.slots and not self.mapped


def union_read(router: Router, numbers: list[int], host_of: Callable,
               part: Callable[[int], tuple[str, list]]) -> list[tuple]:
    """Rows of ``part(n)`` (a SELECT and its parameters) for every shard or bucket ``n``,
    as ``UNION ALL`` queries of up to ``UNION_PARTS`` parts per server, one at a time."""
    return [row for host, queries in _server_queries(numbers, host_of, part)
            for sql, params in queries for row in router.query(host, sql, params)]


def scan(router: Router, numbers: list[int], host_of: Callable,
         part: Callable[[int], tuple[str, list]], first_only: bool = False) -> list[tuple]:
    """``union_read``'s rows, every server read at once (a thread a server, each sending its
    own queries in order); with ``first_only``, a server sends no more queries once any
    query has returned a row (the rows read by then are returned). For the planner, whose
    reads open thousands of tables on each server: the servers open theirs side by side."""
    per_server = _server_queries(numbers, host_of, part)
    found = Event()
    rows: list[tuple] = []

    def read(host: Host, queries: list[tuple[str, list]]) -> None:
        for sql, params in queries:
            if first_only and found.is_set():
                return
            got = router.query(host, sql, params)
            rows.extend(got)  # list.extend is atomic under the GIL
            if got:
                found.set()
    with ThreadPoolExecutor(max(1, len(per_server)), thread_name_prefix="scan") as pool:
        for f in [pool.submit(read, host, queries) for host, queries in per_server]:
            f.result()
    return rows


def any_row(router: Router, numbers: list[int], host_of: Callable,
            part: Callable[[int], tuple[str, list]]) -> bool:
    """Whether ``part(n)`` has a row for any ``n``: ``scan`` with ``first_only``."""
    return bool(scan(router, numbers, host_of, part, first_only=True))


def _server_queries(numbers: list[int], host_of: Callable,
                    part: Callable[[int], tuple[str, list]]
                    ) -> list[tuple[Host, list[tuple[str, list]]]]:
    """``union_read``'s queries (SQL and parameters) of each server, with a host of it."""
    by_server: dict[tuple, list[int]] = defaultdict(list)
    hosts = {}
    for n in numbers:
        h = host_of(n)
        hosts[h.server] = h
        by_server[h.server].append(n)
    return [(hosts[server], [(" UNION ALL ".join(s for s, _ in group),
                              [p for _, ps in group for p in ps])
                             for group in _groups([part(n) for n in ns])])
            for server, ns in by_server.items()]


def _groups(sqls: list[tuple[str, list]]) -> list[list[tuple[str, list]]]:
    """``sqls`` in order, cut into statements of at most ``UNION_PARTS`` parts and
    ``MAX_PARAMS`` parameters (a part with more goes alone): parts may differ in size."""
    out: list[list[tuple[str, list]]] = []
    size = 0
    for sql in sqls:
        if not out or len(out[-1]) == UNION_PARTS or size + len(sql[1]) > MAX_PARAMS:
            out.append([])
            size = 0
        out[-1].append(sql)
        size += len(sql[1])
    return out


def split_read(router: Router, sels: dict[int, Selection], host_of: Callable,
               part: Callable[[int, Selection], tuple[str, list]]) -> list[tuple]:
    """``union_read`` of ``part(n, piece)`` for every shard or bucket ``n`` and every piece
    of its selection: a list is cut into ``IN_LIMIT`` values a piece (each one index read)."""
    pieces = [(n, sel if sel.values is None else Selection.of(list(sel.values[i:i + IN_LIMIT])))
              for n, sel in sels.items()
              for i in (range(0, len(sel.values), IN_LIMIT) if sel.values is not None else [0])]
    return union_read(router, list(range(len(pieces))), lambda i: host_of(pieces[i][0]),
                      lambda i: part(*pieces[i]))


def shard_read(router: Router, part: Callable[[int], tuple[str, list]]) -> list[tuple]:
    """``union_read`` over every shard of the map."""
    return union_read(router, list(router.shardmap.shards()), router.host_for, part)


def mapped_types(router: Router) -> set[int]:
    """The object types that have a ``legacy_id_map`` row in some bucket (one index read a
    bucket: the distinct first primary-key column; the servers read at once)."""
    m = router.shardmap
    return {int(t) for t, in scan(router, list(range(m.buckets)), m.mod_master, lambda b: (
        f"SELECT DISTINCT type_id FROM {mod_table(b, 'legacy_id_map')}", []))}


def tables_empty(router: Router, tables: tuple[str, ...]) -> bool:
    """Whether the shard tables ``tables`` hold no row (active or not) on any shard: a ``LIMIT 1``
    read per shard and table, the servers read at once, until one finds a row."""
    shards = list(router.shardmap.shards())
    return not any(any_row(router, shards, router.host_for, lambda s, name=name: (
        f"(SELECT 1 FROM {shard_table(s, name)} LIMIT 1)", [])) for name in tables)


def mapped_ids(router: Router, type_name: str, sel: Selection) -> dict[int, int]:
    """``legacy_id_map`` rows of ``type_name`` in the selection: legacy ID -> new ID."""
    m = router.shardmap
    t = ids.TYPES[type_name]
    if sel.values is None:
        buckets = {b: sel for b in range(m.buckets)}
    else:
        groups: dict[int, list[int]] = defaultdict(list)
        for v in sel.values:
            groups[bucket_of(legacy_key(type_name, v), m.buckets)].append(v)
        buckets = {b: Selection.of(vs) for b, vs in groups.items()}

    def part(b: int, piece: Selection) -> tuple[str, list]:
        cond, params = piece.where("legacy_id")
        return (f"SELECT legacy_id, new_id FROM {mod_table(b, 'legacy_id_map')} "
                f"WHERE type_id = {t} AND {cond}", params)
    rows = split_read(router, dict(sorted(buckets.items())), m.mod_master, part)
    return {int(legacy): int(new) for legacy, new in rows}


def _active_slots(s: int, name: str, sel: Selection) -> tuple[str, list]:
    """The statement reading shard ``s``'s active rows of ``name`` whose local IDs ``sel``
    selects, as ``(shard, local_id, data)``."""
    cond, params = sel.where("local_id")
    return (f"SELECT {s}, local_id, data FROM {shard_table(s, name)} "
            f"WHERE active = 1 AND {cond}", params)


def _slots_small(router: Router, name: str, type_id: int, sel: Selection) -> list[tuple]:
    def part(s: int, piece: Selection) -> tuple[str, list]:
        return _active_slots(s, name, piece)
    sels = {s: sel for s in router.shardmap.shards()}
    return [(ids.encode(s, type_id, local), local, data)
            for s, local, data in split_read(router, sels, router.host_for, part)]


def _slots_by_id(router: Router, name: str, new_ids: list[int]) -> list[tuple]:
    by_shard: dict[int, list[int]] = defaultdict(list)
    for n in new_ids:
        by_shard[n >> ids.SHARD_SHIFT].append(n & ids.MAX_LOCAL)
    sels = {s: Selection.of(v) for s, v in by_shard.items()}

    def part(s: int, piece: Selection) -> tuple[str, list]:
        return _active_slots(s, name, piece)
    rows = split_read(router, dict(sorted(sels.items())), router.host_for, part)
    type_id = next(iter(new_ids)) >> ids.TYPE_SHIFT & ids.MAX_TYPE if new_ids else 0
    return [(ids.encode(s, type_id, local), local, data) for s, local, data in rows]


def held_objects(router: Router, name: str, type_name: str, sel: Selection) -> Held:
    """Active object slots and ``legacy_id_map`` rows the target holds for ``sel``; a slot
    counts only if its document names the legacy row that owns it.

    A legacy ID below 2**35 is looked for at its local ID on every shard (an earlier
    placement may have left it anywhere) unless ``sel.mapped_only``: then only where
    ``legacy_id_map`` places it, one index read instead of one per shard. That is for
    objects no change since the last completed apply could have moved (``farm sync``):
    an object is only ever written away from its mapped shard by a change of its
    placement, and until that change is applied to the end it is applied again."""
    out = Held(mapped=mapped_ids(router, type_name, sel))
    type_id = ids.TYPES[type_name]
    small = None if sel.mapped_only else sel.small()
    rows = _slots_small(router, name, type_id, small) if small else []
    found = [new for legacy, new in out.mapped.items() if sel.mapped_only or not fits(legacy)]
    rows += _slots_by_id(router, name, found) if found else []
    for new_id, local, data in rows:
        doc = loads(data)
        legacy = doc.get("legacy_id")
        if isinstance(legacy, int) and (legacy == local or out.mapped.get(legacy) == new_id):
            out.slots[new_id] = (legacy, doc)
    return out


def user_ids(router: Router, sel: Selection, place_user: Callable[[int], int]) -> list[int]:
    """New IDs the selection's users have or had in the target: a small legacy ID's is a
    pure function of it (users never move), a big one's is in ``legacy_id_map``."""
    t = ids.TYPES["user"]
    out = ([new for legacy, new in mapped_ids(router, "user", sel).items() if not fits(legacy)]
           if sel.has_big() else [])
    small = sel.small()
    if small is not None and small.values is not None:
        out += [ids.encode(place_user(u), t, u) for u in small.values]
    return out


def held_links(router: Router, table: str, sel: Selection,
               place_user: Callable[[int], int]) -> set[tuple[int, int]]:
    """``(from_id, to_id)`` rows of forward mapping ``table`` whose user is in ``sel`` (and,
    for a selection of pairs, whose legacy key is one of them: a small legacy ID is the
    local ID of every new ID it had, wherever it was placed)."""
    t = ids.TYPES["user"]
    small = sel.small()
    rows: list[tuple] = []
    if small is not None and small.values is None:  # a range: one index range per shard
        def part(s: int) -> tuple[str, list]:
            return (f"SELECT from_id, to_id FROM {shard_table(s, table)} "
                    "WHERE from_id BETWEEN %s AND %s",
                    [ids.encode(s, t, small.lo), ids.encode(s, t, small.hi)])
        rows += shard_read(router, part)
        sel = Selection.of([]) if not sel.has_big() else sel
    listed = user_ids(router, sel, place_user) if sel.values != () else []
    by_shard: dict[int, list[int]] = defaultdict(list)
    for u in listed:
        by_shard[u >> ids.SHARD_SHIFT].append(u)
    sels = {s: Selection.of(v) for s, v in by_shard.items()}
    pair_filter = _pair_filter(sel.pairs) if sel.pairs is not None else None

    def listed_part(s: int, piece: Selection) -> tuple[str, list]:
        cond, params = piece.where("from_id")
        if pair_filter is not None:
            more, more_params = pair_filter(piece.values or ())
            cond, params = f"{cond} AND {more}", params + more_params
        return f"SELECT from_id, to_id FROM {shard_table(s, table)} WHERE {cond}", params
    rows += split_read(router, dict(sorted(sels.items())), router.host_for, listed_part)
    held = {(int(a), int(b)) for a, b in rows}
    if sel.pairs is None:
        return held
    return {(a, b) for a, b in held if (a & ids.MAX_LOCAL, b & ids.MAX_LOCAL) in sel.pairs}


def _pair_filter(pairs: frozenset[tuple[int, int]]
                 ) -> Callable[[tuple[int, ...]], tuple[str, list]]:
    """For a selection of pairs: the condition keeping, of the rows of some users (their
    new IDs), only those whose ``to_id`` has the local ID of one of those users' pairs.
    The server drops the users' other rows (one index range each still reads them) instead
    of sending them to be dropped here; what passes is filtered to the exact pairs after
    (a user's row may pair it with another user's pin or board)."""
    targets: dict[int, list[int]] = defaultdict(list)
    for a, b in pairs:
        targets[a].append(b)

    def cond(users: tuple[int, ...]) -> tuple[str, list]:
        wanted = sorted({b for u in users for b in targets.get(u & ids.MAX_LOCAL, ())})
        if not wanted:
            return "FALSE", []
        if len(wanted) > IN_LIMIT:  # a longer list would become a join: filter here only
            return "TRUE", []
        return (f"(to_id & {ids.MAX_LOCAL}) IN ({','.join(['%s'] * len(wanted))})", wanted)
    return cond
