"""Opening a new shard range on a new master/slave pair (``farm shards open``).

The range's databases and tables are created on its master (a slave replicating
from it gets them through replication), every new shard records the map version
that places it (``shard_state``), and the range is added to ``shards`` and to
``open`` as the next map version (a compare-and-set: refused if the map changed
meanwhile). From then on ``sharding.placement`` puts a share of new users there,
set by the weight; existing users never move.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfarm.errors import FarmError, StaleStateError, UsageError
from shardfarm.mysql.dsn import Host
from sharding import fencing
from sharding.ids import MAX_SHARD
from sharding.mappublish import amend
from sharding.provision import create_shard
from sharding.router import Router
from sharding.shardmap import ShardMap


@dataclass(frozen=True)
class Opened:
    """What ``open_range`` did."""

    lo: int
    hi: int
    master: str
    slave: str
    weight: int
    version: int


def parse_range(text: str) -> tuple[int, int]:
    """``LO-HI`` (inclusive shard numbers) or a ``UsageError`` naming the mistake."""
    lo, sep, hi = text.partition("-")
    if not sep or not lo.isdigit() or not hi.isdigit():
        raise UsageError(f"bad shard range {text[:40]!r} (expected LO-HI, e.g. 512-767)")
    a, b = int(lo), int(hi)
    if a > b or b > MAX_SHARD:
        raise UsageError(f"bad shard range {a}-{b} (need LO <= HI <= {MAX_SHARD})")
    return a, b


def host_of(m: ShardMap, name: str, role: str) -> Host:
    """The map's host ``name`` or a ``UsageError`` listing the known ones."""
    if name not in m.hosts:
        known = ", ".join(sorted(m.hosts))[:200]
        raise UsageError(f"--{role} {name[:64]!r} is not a host of the shard map (add it with "
                         f"'farm shards publish'; known: {known})")
    return m.hosts[name]


def check_reachable(router: Router, host: Host, role: str) -> None:
    """Refuse, in one line, a host that does not answer."""
    try:
        router.query(host, "SELECT 1")
    except FarmError as exc:
        raise StaleStateError(f"--{role} {host.name} is unreachable: "
                              f"{str(exc).splitlines()[0][:300]}") from None


def _check_free(m: ShardMap, lo: int, hi: int) -> None:
    for r in m.shard_ranges:
        if r.lo <= hi and lo <= r.hi:
            raise UsageError(f"shards {lo}-{hi} overlap shards {r.lo}-{r.hi} on {r.master} "
                             "(choose a range no entry of the map holds)")


def _check_pair(m: ShardMap, master: str, slave: str) -> None:
    """Refuse (``UsageError``, one line) one host as both master and slave (the range would
    have no backup) and a host the map marks gone."""
    if master == slave:
        raise UsageError(f"--master and --slave both name {master[:64]}; name the range's own "
                         "slave (another host of the map)")
    for role, name in (("master", master), ("slave", slave)):
        if name in m.gone:
            raise UsageError(f"--{role} {name[:64]} is marked gone in the shard map (its slave "
                             "was promoted in its place); choose a live host")


def open_range(router: Router, spec: str, lo: int, hi: int, master: str, slave: str,
               weight: int | None = None, timeout: float = 10.0) -> Opened:
    """Create shards ``lo..hi`` on ``master`` and publish them, open, as the next version."""
    m = router.shardmap
    _check_free(m, lo, hi)
    _check_pair(m, master, slave)
    hosts = {role: host_of(m, name, role) for role, name in (("master", master),
                                                             ("slave", slave))}
    for role, host in hosts.items():
        check_reachable(router, host, role)
    if weight is not None and not 1 <= weight <= 1_000_000:
        raise UsageError(f"--weight {weight} out of range 1..1000000")
    version = m.version + 1
    for shard in range(lo, hi + 1):
        create_shard(router, hosts["master"], shard)
        router.run_on(hosts["master"],
                      lambda cur, s=shard: fencing.set_state(cur, s, version, False), shard)

    def change(doc: dict) -> None:
        if doc["version"] != m.version:
            raise StaleStateError(f"the shard map changed to version {doc['version']} while "
                                  "the range was created; run the command again")
        doc["shards"].append({"range": [lo, hi], "master": master, "slave": slave})
        doc.setdefault("open", []).append([lo, hi] if weight is None else [lo, hi, weight])
    new = amend(spec, change, timeout)
    return Opened(lo, hi, master, slave, new.open_weights[-1], new.version)
