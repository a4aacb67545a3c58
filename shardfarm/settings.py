"""One ``Settings`` object built from the environment and passed explicitly.

Every ``FARM_*`` variable is overridden by the command-line flag of the same meaning.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import redis

from shardfarm import tuning
from shardfarm.bounds import REDIS_REPLY_LIMIT
from shardfarm.errors import ConfigError, UsageError
from shardfarm.mysql.dsn import DSN
from shardfarm.redact import UNENCODED, authority_problem, redact_url, unencoded_password

T = TypeVar("T")
DEFAULTS = {
    "FARM_REDIS_URL": "redis://127.0.0.1:6379/0",
    "FARM_CONTROL_DSN": "mysql://root@127.0.0.1:3306/farm_control",
    "FARM_LEGACY_DSN": "mysql://root@127.0.0.1:3306/legacy",
    "FARM_SHARDMAP": "",
    "FARM_EXPORT_URL": "",
}
# the command-line flag that overrides each variable: a bad value given there is a usage
# mistake (exit 2), in the environment a configuration one (exit 1)
FLAGS = {"FARM_REDIS_URL": "--redis-url", "FARM_CONTROL_DSN": "--control-dsn",
         "FARM_LEGACY_DSN": "--legacy-dsn", "FARM_SHARDMAP": "--shardmap",
         "FARM_EXPORT_URL": "--export-url"}


@dataclass(frozen=True)
class Settings:
    """Everything a command needs to find Redis, MySQL, the shard map and the export target."""

    redis_url: str
    control_dsn: DSN
    legacy_dsn: DSN
    shardmap_path: Path | None
    export_url: str
    connect_timeout: float = 10.0
    shardmap_url: str = ""  # zk://host:port/path when the map lives in ZooKeeper

    @property
    def shardmap_spec(self) -> str:
        """``FARM_SHARDMAP`` as given to child processes: a zk:// URL, a path, or empty."""
        return self.shardmap_url or str(self.shardmap_path or "")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: str | None) -> Settings:
        """Build settings from ``env`` (default ``os.environ``); non-empty overrides win.
        Every tuning variable of ``env`` is checked too (``shardfarm.tuning``)."""
        env = os.environ if env is None else env
        tuning.check_environment(env)
        raw = {k: env.get(k) or v for k, v in DEFAULTS.items()}
        flagged = {key for key, value in overrides.items() if value}
        raw.update({key: overrides[key] for key in flagged})

        def checked(key: str, parse: Callable[[str], T]) -> T:
            return _checked(key, parse, raw[key], key in flagged)
        zk = raw["FARM_SHARDMAP"] if raw["FARM_SHARDMAP"].startswith("zk://") else ""
        return cls(
            redis_url=checked("FARM_REDIS_URL", _redis_url),
            control_dsn=checked("FARM_CONTROL_DSN", partial(DSN.parse, what="FARM_CONTROL_DSN")),
            legacy_dsn=checked("FARM_LEGACY_DSN", partial(DSN.parse, what="FARM_LEGACY_DSN")),
            shardmap_path=(Path(raw["FARM_SHARDMAP"]).resolve()
                           if raw["FARM_SHARDMAP"] and not zk else None),
            shardmap_url=zk,
            export_url=checked("FARM_EXPORT_URL", _export_url),
            connect_timeout=tuning.connect_timeout(env),
        )

    def redis(self, socket_timeout: float | None = None) -> redis.Redis:
        """A client of the farm's Redis whose connecting is bounded by ``connect_timeout``;
        its replies (and a ``rediss://`` handshake) by ``socket_timeout`` if given (a status
        view's), else by ``REDIS_REPLY_LIMIT``: a server that accepts and never answers
        is an error, not a hang. A worker's takes block 0.5 s at a time (``jobs.dequeue``),
        and rq raises the bound of its own connection to its dequeue timeout."""
        return redis.Redis.from_url(self.redis_url, socket_connect_timeout=self.connect_timeout,
                                    socket_timeout=socket_timeout or REDIS_REPLY_LIMIT)

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    def describe(self) -> dict[str, str]:
        """A printable summary with every password hidden."""
        return {
            "redis": redact_url(self.redis_url),
            "control": str(self.control_dsn),
            "legacy": str(self.legacy_dsn),
            "shardmap": self.shardmap_spec or "(built-in demo map)",
            "export": self.export_url,
            "connect_timeout": f"{self.connect_timeout:g} s",
        }


def _checked(key: str, parse: Callable[[str], T], text: str, flagged: bool) -> T:
    """``parse(text)``; a bad value given as a flag is a ``UsageError`` naming the flag."""
    try:
        return parse(text)
    except ConfigError as exc:
        if not flagged:
            raise
        raise UsageError(str(exc).replace(f"bad {key}", f"bad {FLAGS[key]}", 1)) from None


def _redis_url(url: str) -> str:
    """The URL if redis-py itself accepts it (so what passes here also connects)."""
    def bad(why: str) -> ConfigError:
        password = _password_of(url)
        if password:
            why = why.replace(password, "***")
        why = UNENCODED if unencoded_password(url) else why  # a cause, not a symptom
        return ConfigError(f"bad FARM_REDIS_URL: {redact_url(url)} ({why})")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise bad("expected redis://[:password@]host:port/db, rediss://… or unix://path")
    problem = authority_problem(url)  # urlsplit's own words may quote the password
    if problem:
        raise bad(problem)
    try:
        pool = redis.ConnectionPool.from_url(url)
        pool.connection_class(**pool.connection_kwargs)  # unknown options fail here; no I/O
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise bad(" ".join(str(exc).split())[:200] or type(exc).__name__) from None
    if url.startswith("unix://"):
        return url
    parts = urlsplit(url)
    if parts.port == 0:
        raise bad("port 0")
    if parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise bad(f"the database must be a number, got {parts.path.strip('/')[:20]!r}")
    return url


def _password_of(url: str) -> str:
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


# what boto3 accepts as a bucket name (legacy us-east-1 names included): anything else fails
# every call with a bare "Parameter validation failed:", and "user:password@" would be shown
S3_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")


def export_url_problem(url: str) -> str | None:
    """Why ``url`` is not an export destination (``s3://bucket/prefix`` or
    ``file:///abs/dir``), or ``None``: the one check behind ``FARM_EXPORT_URL``,
    ``--export-url`` and ``--dest``."""
    if url.startswith("file://"):
        return None if url[len("file://"):].startswith("/") else \
            "file:// needs an absolute path: file:///abs/dir"
    if url.startswith("s3://") and url[len("s3://"):].partition("/")[0]:
        bucket = url[len("s3://"):].partition("/")[0]
        return None if S3_BUCKET.fullmatch(bucket) else \
            "an S3 bucket name is letters, digits, '.', '-' and '_' (no user or password)"
    return "expected s3://bucket/prefix or file:///abs/dir"


def _export_url(url: str) -> str:
    if not url:
        return f"file://{Path.cwd() / 'exports'}"
    problem = export_url_problem(url)
    if problem:
        raise ConfigError(f"bad FARM_EXPORT_URL: {redact_url(url)} ({problem})")
    return url
