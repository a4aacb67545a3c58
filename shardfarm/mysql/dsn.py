"""Parse ``mysql://user[:password]@host[:port]/database[?tls]`` without ever printing the password.

TLS parameters (the only query parameters accepted; anything else is refused):

- ``ssl_ca=PATH``: the CA that signed the server's certificate; TLS is then required.
- ``ssl_cert=PATH&ssl_key=PATH``: a client certificate and its key (both or neither).
- ``ssl_verify=1|0``: verify the server's certificate against ``ssl_ca`` and its host name
  (default 1 when ``ssl_ca`` is given); 0 encrypts without checking who answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from shardfarm.errors import ConfigError
from shardfarm.redact import UNENCODED, authority_problem, redact_url, unencoded_password

_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
TLS_PARAMS = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_verify")
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
# The connection a DSN variable names, and the variable an operator checks when it fails.
NAMES = {"FARM_CONTROL_DSN": "control", "FARM_LEGACY_DSN": "legacy"}


@dataclass(frozen=True)
class Host:
    """A named MySQL server and the account to use there: a host of the shard map (several
    names may point at one server), or the server of a ``DSN``. ``repr()`` hides the password."""

    name: str
    host: str
    port: int
    user: str
    password: str = field(default="", repr=False)
    tls: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def from_dsn(cls, name: str, dsn: DSN) -> Host:
        """The server of ``dsn`` under another name (e.g. ``control`` for its pool)."""
        return cls(name, dsn.host, dsn.port, dsn.user, dsn.password, dsn.tls)

    def tls_args(self) -> dict:
        """PyMySQL's TLS keyword arguments (``ssl_*`` keys of the host entry, or its DSN's)."""
        return tls_args(dict(self.tls))

    @property
    def server(self) -> tuple[str, int, str]:
        """The physical server identity that connection pools are keyed by."""
        return (self.host, self.port, self.user)

    def __repr__(self) -> str:
        return f"Host({self.name}={self.user}@{self.host}:{self.port})"


@dataclass(frozen=True, kw_only=True)
class DSN(Host):
    """A MySQL data source: a ``Host`` (named after its variable: ``control``, ``legacy``,
    else ``mysql``) and a database. ``str()`` and ``repr()`` hide the password."""

    database: str
    source: str = field(default="DSN", compare=False)

    @classmethod
    def parse(cls, text: str, *, what: str = "DSN") -> DSN:
        """Parse a DSN, raising ``ConfigError`` (one line, without the password) when malformed."""
        def bad(why: str) -> ConfigError:
            why = UNENCODED if unencoded_password(text) else why  # a cause, not a symptom
            return ConfigError(f"bad {what}: {redact_url(text)} ({why})")
        problem = authority_problem(text)  # urlsplit's own words may quote the password
        if problem:
            raise bad(problem)
        parts = urlsplit(text)
        port = parts.port or 3306
        if parts.scheme not in ("mysql", "mariadb"):
            raise bad("expected mysql://user@host:port/db")
        database = parts.path.lstrip("/")
        if not parts.hostname or not parts.username:
            raise bad("needs a user and a host")
        if not _DB_NAME.match(database):
            raise bad("database name missing or invalid")
        if parts.fragment:
            raise bad("unexpected '#' part")
        try:
            tls = _tls_params(parts.query)
        except ValueError as exc:
            raise bad(str(exc)) from None
        return cls(name=NAMES.get(what, "mysql"), host=parts.hostname, port=port,
                   user=unquote(parts.username), database=database,
                   password=unquote(parts.password or ""), tls=tls, source=what)

    def __str__(self) -> str:
        auth = f"{self.user}:***" if self.password else self.user
        return f"mysql://{auth}@{self.host}:{self.port}/{self.database}{self._query()}"

    def _query(self) -> str:
        return f"?{urlencode(self.tls)}" if self.tls else ""

    def url(self) -> str:
        """The full DSN, password included: for a child process's environment, never for output."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}"
                                            if self.password else "")
        return f"mysql://{auth}@{self.host}:{self.port}/{self.database}{self._query()}"

    def connect_args(self) -> dict:
        """Keyword arguments for ``pymysql.connect`` (without the database)."""
        return {"host": self.host, "port": self.port, "user": self.user,
                "password": self.password, **self.tls_args()}


def _tls_params(query: str) -> tuple[tuple[str, str], ...]:
    """The DSN's query parameters, checked: only ``TLS_PARAMS``, each once, consistent."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError("malformed query string") from None
    seen: dict[str, str] = {}
    for key, value in pairs:
        if key not in TLS_PARAMS:
            raise ValueError(f"unknown parameter {key[:40]!r}; known: {', '.join(TLS_PARAMS)}")
        if key in seen:
            raise ValueError(f"{key} given twice")
        if not value:
            raise ValueError(f"{key} needs a value")
        seen[key] = value
    tls_args(seen)  # raises ValueError when inconsistent
    return tuple(sorted(seen.items()))


def tls_args(params: dict[str, str]) -> dict:
    """Map ``ssl_ca``/``ssl_cert``/``ssl_key``/``ssl_verify`` to PyMySQL's TLS arguments.

    Raises ``ValueError`` for an inconsistent set (a key without its certificate,
    verification without a CA, a ``ssl_verify`` that is not 0 or 1).
    """
    if not params:
        return {}
    verify_text = params.get("ssl_verify")
    verify = _BOOLS.get(verify_text.lower()) if verify_text is not None else None
    if verify_text is not None and verify is None:
        raise ValueError(f"ssl_verify must be 0 or 1, got {verify_text[:20]!r}")
    if ("ssl_cert" in params) != ("ssl_key" in params):
        raise ValueError("ssl_cert and ssl_key go together")
    if "ssl_ca" not in params and verify is not None:
        raise ValueError("ssl_verify needs ssl_ca (the CA that signed the server's certificate)")
    verify = bool(params.get("ssl_ca")) if verify is None else verify
    out = {k: params[k] for k in ("ssl_ca", "ssl_cert", "ssl_key") if k in params}
    return {**out, "ssl_verify_cert": verify, "ssl_verify_identity": verify}

