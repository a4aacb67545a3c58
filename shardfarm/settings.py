"""One ``Settings`` object built from the environment (CONTRACTS §2) and passed explicitly."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from shardfarm.dsn import DSN, _redact
from shardfarm.errors import ConfigError

DEFAULTS = {
    "FARM_REDIS_URL": "redis://127.0.0.1:6379/0",
    "FARM_CONTROL_DSN": "mysql://root@127.0.0.1:3306/farm_control",
    "FARM_LEGACY_DSN": "mysql://root@127.0.0.1:3306/legacy",
    "FARM_SHARDMAP": "",
    "FARM_EXPORT_URL": "",
}


@dataclass(frozen=True)
class Settings:
    """Everything a command needs to find Redis, MySQL, the shard map and the export target."""

    redis_url: str
    control_dsn: DSN
    legacy_dsn: DSN
    shardmap_path: Path | None
    export_url: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: str | None) -> Settings:
        """Build settings from ``env`` (default ``os.environ``); non-empty overrides win."""
        env = os.environ if env is None else env
        raw = {k: env.get(k) or v for k, v in DEFAULTS.items()}
        for key, value in overrides.items():
            if value:
                raw[key] = value
        return cls(
            redis_url=_redis_url(raw["FARM_REDIS_URL"]),
            control_dsn=DSN.parse(raw["FARM_CONTROL_DSN"], what="FARM_CONTROL_DSN"),
            legacy_dsn=DSN.parse(raw["FARM_LEGACY_DSN"], what="FARM_LEGACY_DSN"),
            shardmap_path=Path(raw["FARM_SHARDMAP"]).resolve() if raw["FARM_SHARDMAP"] else None,
            export_url=_export_url(raw["FARM_EXPORT_URL"]),
        )

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    def describe(self) -> dict[str, str]:
        """A printable summary with every password hidden."""
        return {
            "redis": _redact(self.redis_url),
            "control": str(self.control_dsn),
            "legacy": str(self.legacy_dsn),
            "shardmap": str(self.shardmap_path or "(built-in demo map)"),
            "export": self.export_url,
        }


def _redis_url(url: str) -> str:
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"bad FARM_REDIS_URL: {_redact(url)} (expected redis://host:port/db)")
    return url


def _export_url(url: str) -> str:
    if not url:
        return f"file://{Path.cwd() / 'exports'}"
    if url.startswith("file://"):
        if not url[len("file://"):].startswith("/"):
            raise ConfigError(f"bad FARM_EXPORT_URL: {url} (file:// needs an absolute path)")
        return url
    if url.startswith("s3://") and len(url) > len("s3://"):
        return url
    raise ConfigError(f"bad FARM_EXPORT_URL: {_redact(url)} (expected s3://bucket/prefix "
                      "or file:///abs/dir)")
