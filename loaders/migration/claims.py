"""Who owns an object slot, and the survey a chunk makes before it writes any.

A slot (shard, table, local ID) belongs to one legacy row: the one whose ID the
slot is (below 2**35) or the one ``legacy_id_map`` gave it to (2**35 and above,
held by an inactive placeholder until the row lands). The stored document names its
owner (``legacy_id``). Before a chunk writes, it reads the slots its object rows
want: a slot held by anything else (another legacy row, an object the application
created; only a corrupted or hand-edited target can get there) is *taken*, and that
legacy row is quarantined as ``local_id_taken`` with everything it would write; the
writer then overwrites only slots it re-checks, locked, as its own (``confirm_owned``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

from loaders.migration.build import TargetRows
from loaders.migration.present import union_read
from shardfarm.errors import RetryableError
from shardfarm.mysql.inlist import IN_LIST_MAX
from shardfarm.mysql.pipeline import Pipeline
from sharding.ids import FIRST_ALLOCATED
from sharding.router import Router
from sharding.schema import shard_table

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

IN_BATCH = IN_LIST_MAX
DENSE = 8  # keys spanning at most this many slots each are read as one range
HOLDING = "local_id, JSON_VALUE(data, '$.legacy_id'), JSON_EXISTS(data, '$.allocating')"
HOLDER = f"SELECT {HOLDING}"
TAKEN = "local_id_taken"
_LOCAL, _LEGACY = itemgetter(0), itemgetter(2)  # of an object row (local_id, data, legacy_id)


class SlotChangedError(RetryableError):
    """A slot changed hands between the survey and the write: try the chunk again."""


def owns(local: int, legacy: int, holder: str | None, placeholder: int | None) -> bool:
    """Whether legacy row ``legacy`` owns slot ``local`` now held by a row whose document
    names ``holder`` as its legacy ID (``None``: none) and is ``placeholder`` or not."""
    if holder is not None:
        return holder == str(legacy)
    # a placeholder of the allocated half is the one legacy_id_map gave this row
    return bool(placeholder) and local >= FIRST_ALLOCATED and not 0 < legacy < FIRST_ALLOCATED


def describe(shard: int, local: int, holder: str | None) -> str:
    """Quarantine detail of a taken slot (IDs only)."""
    who = f"legacy {holder}" if holder is not None else "an object without a legacy_id"
    return f"shard {shard} local_id {local} holds {who}"


@dataclass
class Survey:
    """What a chunk's slots hold: the legacy rows whose slot is taken (with the reason's
    detail) and, per shard table, the slots already held by their own rows."""

    taken: dict[int, str] = field(default_factory=dict)
    held: dict[tuple[int, str], set[int]] = field(default_factory=lambda: defaultdict(set))


def _conditions(locals_: list[int], ranged: bool = False) -> list[tuple[str, list]]:
    """Conditions reading the slots ``locals_`` of one table: the legacy half as one range
    when its keys are dense or ``ranged`` (they are the keys of a range of legacy keys on
    this shard: whatever the shard holds between them is of that range, so the read is
    bounded by it, however sparse the keys, and an empty table costs nothing), else by key
    like the rest (sync's keys are scattered over the table), ``IN_BATCH`` keys a read.
    (Sorted and split in C: a chunk's survey sees every one of its rows here.)"""
    keys = sorted(locals_)
    k = bisect_left(keys, FIRST_ALLOCATED)
    small, big = keys[:k], keys[k:]
    out: list[tuple[str, list]] = []
    if small and (ranged or small[-1] - small[0] < DENSE * len(small)):
        out.append(("local_id BETWEEN %s AND %s", [small[0], small[-1]]))
    elif small:
        big = keys
    for i in range(0, len(big), IN_BATCH):
        part = big[i:i + IN_BATCH]
        out.append((f"local_id IN ({','.join(['%s'] * len(part))})", part))
    return out


def survey(router: Router, target: TargetRows, ranged: bool = False) -> Survey:
    """Read the slots every object row of ``target`` wants (no locks: the writer
    re-checks the ones it overwrites), one ``UNION ALL`` read per group of shard tables
    on one server (with thousands of shards, a read each was a round trip each).
    ``ranged``: ``target`` holds the rows of a range of legacy keys (a migration chunk's
    slice), read as one index range per table (``_conditions``). Spread over 16 shards,
    a slice's sparse pins were 100k keys in ``IN`` lists: 5% of a worker's samples went
    to escaping them."""
    tables = sorted(target.objects.items())
    parts = [(shard, f"SELECT {i}, {HOLDING} FROM {shard_table(shard, name)} "
              f"WHERE {cond}", params)
             for i, ((shard, name), rows) in enumerate(tables)
             for cond, params in _conditions(list(map(_LOCAL, rows)), ranged)]
    found = union_read(router, list(range(len(parts))), lambda n: router.host_for(parts[n][0]),
                       lambda n: parts[n][1:])
    wants: dict[int, dict[int, int]] = {}  # only of tables where a slot is held (a re-run)
    out = Survey()
    for i, local, holder, placeholder in found:
        if i not in wants:
            rows = tables[i][1]
            wants[i] = dict(zip(map(_LOCAL, rows), map(_LEGACY, rows), strict=True))
        (shard, name), want = tables[i][0], wants[i]
        if local not in want:
            continue
        if owns(local, want[local], holder, placeholder):
            out.held[(shard, name)].add(local)
        else:
            out.taken[want[local]] = describe(shard, local, holder)
    return out


def _lock_statements(q: str, keys: list[int]) -> list[tuple[str, list]]:
    return [(f"{HOLDER} FROM {q} WHERE local_id IN ({','.join(['%s'] * len(part))}) FOR UPDATE",
             part) for part in (keys[i:i + IN_BATCH] for i in range(0, len(keys), IN_BATCH))]


def _judge_owned(shard: int, want: dict[int, int], found: list[tuple] | tuple) -> None:
    for local, holder, placeholder in found:
        if not owns(local, want[local], holder, placeholder):
            raise SlotChangedError(f"{describe(shard, local, holder)} since the survey")


def confirm_owned(cur: Cursor, shard: int, q: str, rows: list[tuple]) -> None:
    """Inside the write transaction: lock the slots of ``rows`` (``(local, data, legacy)``)
    and raise ``SlotChangedError`` unless each is empty or held by its own row."""
    want = {local: legacy for local, _, legacy in rows}
    for sql, params in _lock_statements(q, sorted(want)):
        cur.execute(sql, params)
        _judge_owned(shard, want, cur.fetchall())


def queue_confirm_owned(pipe: Pipeline, shard: int, q: str, rows: list[tuple]) -> None:
    """``confirm_owned`` queued in a pipeline as a guard: judged before the writes."""
    want = {local: legacy for local, _, legacy in rows}
    for sql, params in _lock_statements(q, sorted(want)):
        pipe.add(sql, params, check=lambda res: _judge_owned(shard, want, res.rows), guard=True)
