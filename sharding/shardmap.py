"""The shard map: which host pair holds each shard range and mod bucket range.

Loading validates everything and refuses a bad map with a message naming the
entry. Lookups are O(log n) bisections over sorted ranges. ``sharding.mapsource``
re-reads the file when it changes.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardfarm.errors import ShardMapError, UnknownShardError
from shardfarm.mysql.dsn import TLS_PARAMS, Host, tls_args
from sharding.ids import MAX_SHARD

log = logging.getLogger(__name__)
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:%\[\]-]{1,255}$")  # a DNS name, IPv4 or IPv6 address
_USER = re.compile(r"^[^\x00-\x1f\x7f]{1,80}$")  # MariaDB user names: 80 characters, printable


@dataclass(frozen=True)
class Range:
    """An inclusive range of shards (or buckets) held by one master/slave pair."""

    lo: int
    hi: int
    master: str
    slave: str


class ShardMap:
    """A validated shard map. Build with ``ShardMap.from_dict`` or ``load``."""

    def __init__(self, version: int, hosts: dict[str, Host], shards: list[Range],
                 open_ranges: list[tuple[int, int]], buckets: int, mod: list[Range],
                 open_weights: list[int] | None = None, gone: frozenset[str] = frozenset()
                 ) -> None:
        self.version = version
        self.hosts = hosts
        self.shard_ranges = sorted(shards, key=lambda r: r.lo)
        self.open_ranges = open_ranges
        # each open range's share of new users (default: its number of shards)
        self.open_weights = open_weights or [hi - lo + 1 for lo, hi in open_ranges]
        self.gone = gone  # hosts marked dead (a promoted slave replaced their master role)
        self.buckets = buckets
        self.mod_ranges = sorted(mod, key=lambda r: r.lo)
        self._shard_starts = [r.lo for r in self.shard_ranges]
        self._mod_starts = [r.lo for r in self.mod_ranges]

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, doc: object) -> ShardMap:
        """Validate a parsed JSON document and build the map."""
        return _parse(doc)

    @classmethod
    def from_json(cls, text: str, source: str = "shard map") -> ShardMap:
        """Parse JSON text; malformed JSON is refused with its line and column."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ShardMapError(f"{source}: malformed JSON at line {exc.lineno} "
                                f"column {exc.colno}: {exc.msg}") from None
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise ShardMapError(f"{source}: malformed JSON: {str(exc)[:120]}") from None
        except RecursionError:
            raise ShardMapError(f"{source}: JSON nested too deeply") from None
        return _parse(doc)

    @classmethod
    def load(cls, path: Path | str) -> ShardMap:
        """Read and validate the map file at ``path``."""
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError as exc:
            raise ShardMapError(f"cannot read shard map {path}: "
                                f"{exc.strerror or type(exc).__name__}") from None
        except UnicodeDecodeError as exc:
            raise ShardMapError(f"shard map {path} is not UTF-8 text (byte {exc.start})") from None
        return cls.from_json(text, source=str(path))

    # -- lookups --------------------------------------------------------------------------
    def _find(self, ranges: list[Range], starts: list[int], n: int, what: str) -> Range:
        i = bisect.bisect_right(starts, n) - 1
        if i < 0 or ranges[i].hi < n:
            raise UnknownShardError(f"{what} {n} is not in the shard map")
        return ranges[i]

    def shard_range(self, shard: int) -> Range:
        """The range entry holding ``shard``."""
        return self._find(self.shard_ranges, self._shard_starts, shard, "shard")

    def master(self, shard: int) -> Host:
        """The master host of ``shard``: every read and write goes here."""
        return self.hosts[self.shard_range(shard).master]

    def slave(self, shard: int) -> Host:
        """The slave (backup) host of ``shard``: for bulk reads such as exports."""
        return self.hosts[self.shard_range(shard).slave]

    def mod_range(self, bucket: int) -> Range:
        """The range entry holding mod bucket ``bucket``."""
        return self._find(self.mod_ranges, self._mod_starts, bucket, "mod bucket")

    def mod_master(self, bucket: int) -> Host:
        """The master host of a mod bucket."""
        return self.hosts[self.mod_range(bucket).master]

    def shards(self) -> Iterator[int]:
        """Every shard of the map, ascending."""
        for r in self.shard_ranges:
            yield from range(r.lo, r.hi + 1)

    def shard_count(self) -> int:
        """How many shards the map holds."""
        return sum(r.hi - r.lo + 1 for r in self.shard_ranges)

    def open_shards(self) -> list[int]:
        """Shards where new users may be placed, ascending."""
        return [s for lo, hi in self.open_ranges for s in range(lo, hi + 1)]

    def __repr__(self) -> str:
        return (f"ShardMap(v{self.version}, {self.shard_count()} shards, "
                f"{len(self.hosts)} hosts, {self.buckets} buckets)")


def _fail(msg: str) -> ShardMapError:
    return ShardMapError(f"bad shard map: {msg}")


class _Missing:
    """A key the document does not have (``_kind`` says so, rather than "null")."""


MISSING = _Missing()


def _kind(value: object) -> str:
    """What a wrong value is, for a message: its JSON type, and the value if it is short and
    harmless (a number or null; never a string, which may be a password in the wrong place)."""
    if value is MISSING:
        return "nothing (the key is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(value)
        return f"the number {text}" if len(text) <= 24 else "a very large number"
    if isinstance(value, str):
        return "a string"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _label(name: object) -> str:
    """A JSON key or host name as it can appear in a one-line message."""
    return repr(name)[:40] if isinstance(name, str) else _kind(name)


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{where} must be an integer, got {_kind(value)}")
    return value


def _obj(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise _fail(f"{where} must be a JSON list, got {_kind(value)}")
    return value


def _str(value: object, where: str, pattern: re.Pattern, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(f"{where} must be {what}, got {_kind(value)}")
    if not pattern.match(value):
        raise _fail(f"{where} must be {what}")
    return value


def _parse_host(name: object, doc: object) -> Host:
    if not isinstance(name, str) or not _HOST_NAME.match(name):
        raise _fail(f"hosts: invalid host name {_label(name)} (letters, digits, '_', '.', '-')")
    where = f"hosts.{name}"
    d = _obj(doc, where)
    host = _str(d.get("host", MISSING), f"{where}.host", _ADDRESS, "a host name or IP address")
    port = _int(d.get("port", 3306), f"{where}.port")
    if not 1 <= port <= 65535:
        raise _fail(f"{where}.port {port} out of range 1..65535")
    user = _str(d.get("user", "root"), f"{where}.user", _USER, "a user name of 1 to 80 "
                "printable characters")
    password = d.get("password", "")
    if not isinstance(password, str):
        raise _fail(f"{where}.password must be a string, got {_kind(password)}")
    return Host(name, host, port, user, password, _parse_tls(d, where))


def _parse_tls(d: dict, where: str) -> tuple[tuple[str, str], ...]:
    """A host's optional ``ssl_ca``/``ssl_cert``/``ssl_key`` (paths) and ``ssl_verify`` (0/1)."""
    params = {}
    for key in TLS_PARAMS:
        if key not in d:
            continue
        value = d[key]
        if key == "ssl_verify" and isinstance(value, bool | int) and value in (0, 1):
            value = str(int(value))
        if not isinstance(value, str) or not value or "\x00" in value:
            raise _fail(f"{where}.{key} must be a {'0 or 1' if key == 'ssl_verify' else 'path'}"
                        f", got {_kind(value)}")
        params[key] = value
    try:
        tls_args(params)
    except ValueError as exc:
        raise _fail(f"{where}: {exc}") from None
    return tuple(sorted(params.items()))


def _pair(value: object, where: str) -> tuple[int, int]:
    """``[first, last]``: two integers, first <= last, neither negative."""
    pair = _list(value, where)
    if len(pair) != 2:
        raise _fail(f"{where} must be [first, last], got a list of {len(pair)}")
    lo, hi = _int(pair[0], f"{where}[0]"), _int(pair[1], f"{where}[1]")
    if lo < 0 or hi < lo:
        raise _fail(f"{where} [{lo}, {hi}] is empty or negative")
    return lo, hi


def _parse_range(doc: object, where: str, hosts: dict[str, Host], limit: int) -> Range:
    d = _obj(doc, where)
    lo, hi = _pair(d.get("range", MISSING), f"{where}.range")
    if hi > limit:
        raise _fail(f"{where}.range [{lo}, {hi}] goes past {limit}")
    names = []
    for role in ("master", "slave"):
        name = d.get(role)
        if not isinstance(name, str):
            raise _fail(f"{where}.{role} must be a host name, got {_kind(name)}")
        if name not in hosts:
            raise _fail(f"{where}.{role} names unknown host {_label(name)}")
        names.append(name)
    return Range(lo, hi, names[0], names[1])


def _check_overlaps(ranges: list[tuple[str, Range]], what: str) -> None:
    ordered = sorted(ranges, key=lambda t: t[1].lo)
    for (wa, a), (wb, b) in itertools.pairwise(ordered):
        if b.lo <= a.hi:
            raise _fail(f"{wb}.range [{b.lo}, {b.hi}] overlaps {wa}.range [{a.lo}, {a.hi}] "
                        f"({what})")


def _parse_open(doc: object, shards: list[Range]) -> tuple[list[tuple[int, int]], list[int]]:
    """``open``: ``[first, last]`` or ``[first, last, weight]`` (a share of new users)."""
    out, weights = [], []
    for i, item in enumerate(_list(doc, "open")):
        where = f"open[{i}]"
        weight = None
        if isinstance(item, list) and len(item) == 3:
            weight = _int(item[2], f"{where}[2] (weight)")
            if not 1 <= weight <= 1_000_000:
                raise _fail(f"{where} weight {weight} out of range 1..1000000")
            item = item[:2]
        lo, hi = _pair(item, where)
        gap = _gap(lo, hi, shards)
        if gap is not None:
            raise _fail(f"{where} [{lo}, {hi}] is not backed by shards in 'shards' "
                        f"(shard {_span(gap)} is in no range)")
        out.append((lo, hi))
        weights.append(hi - lo + 1 if weight is None else weight)
    return out, weights


def _gap(lo: int, hi: int, ranges: list[Range]) -> tuple[int, int] | None:
    """The first run ``[a, b]`` of ``lo..hi`` that no range covers, or ``None``."""
    need = lo
    for r in sorted(ranges, key=lambda r: r.lo):
        if r.lo > need:
            return need, min(r.lo - 1, hi)
        need = max(need, r.hi + 1)
        if need > hi:
            return None
    return need, hi


def _span(gap: tuple[int, int]) -> str:
    return str(gap[0]) if gap[0] == gap[1] else f"{gap[0]}..{gap[1]}"


def _parse_mod(doc: object, hosts: dict[str, Host]) -> tuple[int, list[Range]]:
    d = _obj(doc, "mod")
    buckets = _int(d.get("buckets", MISSING), "mod.buckets")
    if not 1 <= buckets <= 1 << 20:
        raise _fail(f"mod.buckets {buckets} out of range 1..{1 << 20}")
    items = [(f"mod.ranges[{i}]", _parse_range(x, f"mod.ranges[{i}]", hosts, buckets - 1))
             for i, x in enumerate(_list(d.get("ranges", MISSING), "mod.ranges"))]
    _check_overlaps(items, "mod buckets")
    ranges = [r for _, r in items]
    gap = _gap(0, buckets - 1, ranges)
    if gap is not None:
        raise _fail(f"mod.ranges do not cover every bucket 0..{buckets - 1}: bucket "
                    f"{_span(gap)} is in no range")
    return buckets, ranges


def _parse(doc: object) -> ShardMap:
    d = _obj(doc, "the document")
    version = _int(d.get("version", MISSING), "version")
    hosts_doc = _obj(d.get("hosts", MISSING), "hosts")
    if not hosts_doc:
        raise _fail("hosts is empty")
    hosts = {name: _parse_host(name, h) for name, h in hosts_doc.items()}
    items = [(f"shards[{i}]", _parse_range(x, f"shards[{i}]", hosts, MAX_SHARD))
             for i, x in enumerate(_list(d.get("shards", MISSING), "shards"))]
    if not items:
        raise _fail("shards is empty")
    _check_overlaps(items, "shards")
    shards = [r for _, r in items]
    open_ranges, weights = _parse_open(d.get("open", []), shards)
    buckets, mod = _parse_mod(d.get("mod", MISSING), hosts)
    gone = _list(d.get("gone", []), "gone")
    for i, name in enumerate(gone):
        if not isinstance(name, str) or name not in hosts:
            raise _fail(f"gone[{i}] names unknown host {_label(name)}")
    return ShardMap(version, hosts, shards, open_ranges, buckets, mod, weights, frozenset(gone))


def demo_map_doc() -> dict:
    """The built-in demo map: 16 shards on two host pairs, all on the local MariaDB."""
    local = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    return {
        "version": 1,
        "hosts": {n: dict(local) for n in ("MySQL001A", "MySQL001B", "MySQL002A", "MySQL002B")},
        "shards": [{"range": [0, 7], "master": "MySQL001A", "slave": "MySQL001B"},
                   {"range": [8, 15], "master": "MySQL002A", "slave": "MySQL002B"}],
        "open": [[0, 15]],
        "mod": {"buckets": 4096,
                "ranges": [{"range": [0, 2047], "master": "MySQL001A", "slave": "MySQL001B"},
                           {"range": [2048, 4095], "master": "MySQL002A", "slave": "MySQL002B"}]},
    }
