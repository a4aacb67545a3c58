"""Parse ``mysql://user[:password]@host[:port]/database`` without ever printing the password."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from shardfarm.errors import ConfigError

_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class DSN:
    """A MySQL data source. ``str()`` and ``repr()`` hide the password."""

    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)

    @classmethod
    def parse(cls, text: str, *, what: str = "DSN") -> DSN:
        """Parse a DSN, raising ``ConfigError`` (without the password) when malformed."""
        try:
            parts = urlsplit(text)
            port = parts.port or 3306
        except ValueError as exc:
            raise ConfigError(f"bad {what}: {_redact(text)} ({exc})") from None
        if parts.scheme not in ("mysql", "mariadb"):
            raise ConfigError(f"bad {what}: {_redact(text)} (expected mysql://user@host:port/db)")
        database = parts.path.lstrip("/")
        if not parts.hostname or not parts.username:
            raise ConfigError(f"bad {what}: {_redact(text)} (needs a user and a host)")
        if not _DB_NAME.match(database):
            raise ConfigError(f"bad {what}: {_redact(text)} (database name missing or invalid)")
        return cls(host=parts.hostname, port=port, user=unquote(parts.username),
                   database=database, password=unquote(parts.password or ""))

    def __str__(self) -> str:
        auth = f"{self.user}:***" if self.password else self.user
        return f"mysql://{auth}@{self.host}:{self.port}/{self.database}"

    def url(self) -> str:
        """The full DSN, password included: for a child process's environment, never for output."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}"
                                            if self.password else "")
        return f"mysql://{auth}@{self.host}:{self.port}/{self.database}"

    def connect_args(self) -> dict:
        """Keyword arguments for ``pymysql.connect`` (without the database)."""
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}


def _redact(text: str) -> str:
    """Replace the password part of a URL-like string with ``***``."""
    return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", text)
