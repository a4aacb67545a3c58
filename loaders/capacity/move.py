"""Moving shards to another master/slave pair: plan, catch up, freeze, verify, flip, drop.

The bulk copy is a farm run (``copy.copy_chunk`` per range of a table: chunked,
resumable, fenced). Writes made meanwhile are caught up by comparing each range's
digest on both servers and copying again the ranges that differ; a first pass runs
while the application writes, then the range's shards are frozen (``shard_state``:
writes through ``sharding/`` get ``ShardFrozenError``, a retryable error) for a
last pass, a per-table check of row counts and hashes, and the flip: the next map
version puts the shards on the new pair, and each source copy records that version,
so a writer still routing with the old map is refused there (``StaleMapError``)
and goes to the new home once its map is reloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from farmcore.ledger import ChunkSpec
from loaders.capacity.copy import COLUMNS, copy_range, digest, ranges
from shardfarm.errors import FarmError, FatalError, StaleStateError, UsageError
from shardfarm.mysql.dsn import Host
from sharding import fencing
from sharding.growth import check_reachable, host_of
from sharding.mappublish import amend, in_force
from sharding.provision import create_shard
from sharding.router import Router
from sharding.schema import shard_db
from sharding.shardmap import ShardMap

Span = tuple[int | None, int | None]
# Rows per copy chunk, which is also the range the catch-up compares and copies again
# whole: bigger ranges copy faster (fewer chunks, fewer digests); smaller ones shorten
# the freeze when writes land in many ranges. 1M rows on 2 workers: 250k 1.02-1.07x
# mysqldump | mysql, 100k 0.89-0.92x, 50k 0.80x.
ROWS_PER_RANGE = 250_000
PLAN_THREADS = 4


@dataclass
class MovePlan:
    """Which shards move where, from which map version, in which ranges."""

    lo: int
    hi: int
    master: str
    slave: str
    version: int  # the map version the move starts from; the flip publishes version + 1
    sources: dict[int, str]  # shard -> its master's host name before the move
    spans: dict[tuple[int, str], list[Span]] = field(default_factory=dict)

    @property
    def params(self) -> dict:
        """What identifies the move in its run's params (a rerun finds its copy run)."""
        return {"range": [self.lo, self.hi], "to": f"{self.master}/{self.slave}",
                "from_version": self.version, "kinds": list(COLUMNS),
                "sources": [[s, h] for s, h in sorted(self.sources.items())]}

    @classmethod
    def of_params(cls, params: dict) -> MovePlan:
        """The plan a copy run's params describe (without its ranges)."""
        master, slave = params["to"].split("/")
        lo, hi = params["range"]
        return cls(lo, hi, master, slave, params["from_version"],
                   {int(s): h for s, h in params["sources"]})

    def chunks(self) -> list[ChunkSpec]:
        """One chunk per range of each table of each shard."""
        return [ChunkSpec(table, {"shard": s, "table": table, "lo": lo, "hi": hi,
                                  "src": self.sources[s], "dst": self.master})
                for (s, table), spans in sorted(self.spans.items()) for lo, hi in spans]


def check_target(m: ShardMap, lo: int, hi: int, master: str, slave: str) -> None:
    """Refuse, in one line (``UsageError``), a ``--to`` pair the shards cannot move to: a host
    the map does not name or lists under ``gone``, one host named as both master and slave
    (the shards would have no backup), or a slave that is the current master of one of the
    shards. (A master that already holds them is refused by ``plan``, unless an earlier run
    of this move flipped them there.)"""
    if master == slave:
        raise UsageError(f"--to {master[:64]}/{slave[:64]} names one host as both master and "
                         "slave; name the new pair's own slave (MASTER/SLAVE, two hosts)")
    for role, name in (("master", master), ("slave", slave)):
        host_of(m, name, f"to {role}")
        if name in m.gone:
            raise UsageError(f"--to {role} {name} is marked gone in the shard map (its slave "
                             "was promoted in its place); choose a live pair")
    for r in m.shard_ranges:
        if r.lo <= hi and lo <= r.hi and r.master == slave:
            raise UsageError(f"--to slave {slave} is the current master of shard "
                             f"{max(lo, r.lo)}; name the new pair's own slave")


def plan(router: Router, lo: int, hi: int, master: str, slave: str,
         rows_per_range: int = ROWS_PER_RANGE) -> MovePlan:
    """Check the move and cut every table of every shard into ranges."""
    m = router.shardmap
    check_target(m, lo, hi, master, slave)
    dst = m.hosts[master]
    sources = {}
    for s in range(lo, hi + 1):
        try:
            src = m.master(s)
        except FatalError:
            raise UsageError(f"shard {s} is not in the shard map (move shards it holds)") from None
        if src.server == dst.server:
            raise UsageError(f"shard {s} is already on {master}'s server ({src.name})")
        sources[s] = src.name
    for name in {*sources.values(), master, slave}:
        check_reachable(router, m.hosts[name], "to" if name in (master, slave) else "from")
    p = MovePlan(lo, hi, master, slave, m.version, sources)
    keys = [(s, table) for s in sources for table in COLUMNS]
    with ThreadPoolExecutor(PLAN_THREADS) as pool:  # mostly round trips: a few at a time
        cut = pool.map(lambda k: ranges(router, m.hosts[sources[k[0]]], *k, rows_per_range),
                       keys)
        p.spans.update(zip(keys, cut, strict=True))
    return p


def prepare(router: Router, p: MovePlan) -> None:
    """Create the shards on the new master; they take writes from the flip's version on."""
    dst = router.shardmap.hosts[p.master]
    for s in range(p.lo, p.hi + 1):
        create_shard(router, dst, s)
        router.run_on(dst, lambda cur, s=s: fencing.set_state(cur, s, p.version + 1, False), s)


def _hosts(router: Router, p: MovePlan, s: int) -> tuple[Host, Host]:
    m = router.shardmap
    return m.hosts[p.sources[s]], m.hosts[p.master]


def _compare(router: Router, src: Host, dst: Host, s: int, table: str, lo: Span,
             pool: ThreadPoolExecutor) -> tuple[tuple[int, int], tuple[int, int]]:
    """A range's digest on both servers, computed at the same time."""
    theirs = pool.submit(digest, router, dst, s, table, *lo)
    return digest(router, src, s, table, *lo), theirs.result()


def catch_up(router: Router, p: MovePlan, strict: bool = False,
             check: Callable[[int, str], None] | None = None) -> tuple[int, dict[str, int]]:
    """Copy again every range whose digest differs between the copies; returns how many, and
    the rows per table. ``strict`` (the shards are frozen): the copies must then match,
    range by range, in row count and hash (``FatalError`` naming the first that does not).
    ``check(shard, table)`` runs before each range (the move's lock: it raises to stop)."""
    n, rows = 0, dict.fromkeys(COLUMNS, 0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        for (s, table), spans in sorted(p.spans.items()):
            src, dst = _hosts(router, p, s)
            for span in spans:
                if check is not None:
                    check(s, table)
                ours, theirs = _compare(router, src, dst, s, table, span, pool)
                if ours != theirs:
                    copy_range(None, router, src, dst, s, table, *span, replace_all=True)
                    n += 1
                    if strict:
                        ours, theirs = _compare(router, src, dst, s, table, span, pool)
                if strict and ours != theirs:
                    raise FatalError(f"{shard_db(s)}.{table} differs after the copy: {ours[0]} "
                                     f"rows on {src.name}, {theirs[0]} on {p.master}; nothing "
                                     "was flipped")
                rows[table] += ours[0]
    return n, rows


def freeze(router: Router, p: MovePlan, frozen: bool, version: int | None = None,
           shards: list[int] | None = None) -> None:
    """Freeze (or thaw) every source shard (or those of ``shards``); ``version``: record it
    too (the flip's)."""
    for s in range(p.lo, p.hi + 1) if shards is None else shards:
        src, _ = _hosts(router, p, s)

        def mark(cur, s: int = s) -> None:
            was, _ = fencing.state(cur, s)
            fencing.set_state(cur, s, max(was, version or 0), frozen)
        router.run_on(src, mark, s)


def flipped(router: Router, lo: int, hi: int, master: str) -> bool:
    """Whether the map already has every shard of ``lo..hi`` on ``master`` (a move that
    flipped; or shards that were there all along)."""
    m = router.shardmap
    try:
        return all(m.master(s).name == master for s in range(lo, hi + 1))
    except FatalError:
        return False


def record_flip(router: Router, p: MovePlan) -> list[int]:
    """After the flip: each source copy still there records the flipped version and is
    thawed (what a move killed between its flip and its thaw left undone). Returns the
    shards whose source copy was found."""
    found = [s for s in range(p.lo, p.hi + 1) if _source_there(router, p, s)]
    freeze(router, p, False, p.version + 1, shards=found)
    return found


def flip(spec: str, p: MovePlan, timeout: float = 10.0) -> int:
    """Publish the next map version with shards ``lo..hi`` on the new pair; returns it."""
    def change(doc: dict) -> None:
        if doc["version"] != p.version:
            raise StaleStateError(f"the shard map changed to version {doc['version']} during "
                                  "the move; nothing flipped (run the move again)")
        out = []
        for entry in doc["shards"]:
            a, b = entry["range"]
            if b < p.lo or a > p.hi:
                out.append(entry)
                continue
            if a < p.lo:
                out.append({**entry, "range": [a, p.lo - 1]})
            out.append({"range": [max(a, p.lo), min(b, p.hi)], "master": p.master,
                        "slave": p.slave})
            if b > p.hi:
                out.append({**entry, "range": [p.hi + 1, b]})
        doc["shards"] = out
    return amend(spec, change, timeout).version


def flip_landed(spec: str, p: MovePlan, timeout: float = 10.0) -> bool | None:
    """After a flip that raised (a reply lost after the write, a timeout): whether the map
    in force has the move's shards on the new pair from its next version on; ``None``
    when the map cannot be read either."""
    try:
        m = in_force(spec, timeout)
        return (m is not None and m.version > p.version
                and all(m.master(s).name == p.master for s in range(p.lo, p.hi + 1)))
    except FarmError:
        return None


def _source_there(router: Router, p: MovePlan, s: int) -> bool:
    """Whether the source copy of shard ``s`` still exists (not dropped yet)."""
    src, _ = _hosts(router, p, s)
    return bool(router.query(src, "SELECT COUNT(*) FROM information_schema.schemata WHERE "
                             "schema_name = %s", (shard_db(s),), s)[0][0])


def drop_sources(router: Router, p: MovePlan,
                 check: Callable[[int], None] | None = None) -> list[str]:
    """Drop the source copies of moved shards; returns every source copy of the move, each
    now gone. Every shard is checked first: if any source copy has not recorded the flip,
    ``FatalError`` naming them and nothing is dropped. A copy already gone (dropped by an
    earlier run that stopped half way) counts as dropped, so running it again finishes.
    ``check(shard)`` runs before each DROP (the move's lock: it raises to stop)."""
    there = [s for s in range(p.lo, p.hi + 1) if _source_there(router, p, s)]
    behind = [s for s in there if router.run_on(
        _hosts(router, p, s)[0], lambda cur, s=s: fencing.state(cur, s), s)[0] <= p.version]
    if behind:
        named = ", ".join(f"{shard_db(s)} on {p.sources[s]}" for s in behind[:5])
        more = f" and {len(behind) - 5} more" if len(behind) > 5 else ""
        raise FatalError(f"{named}{more} has not recorded the move (run the same move again "
                         "to have it recorded); nothing dropped")
    for s in there:
        if check is not None:
            check(s)
        router.run_on(_hosts(router, p, s)[0], lambda cur, s=s: cur.execute(
            f"DROP DATABASE IF EXISTS `{shard_db(s)}`"), s)
    return [f"{p.sources[s]}:{shard_db(s)}" for s in range(p.lo, p.hi + 1)]
