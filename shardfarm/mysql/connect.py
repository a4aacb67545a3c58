"""How every MySQL connection is opened, and how its errors are named.

One function opens them all (``open_connection``): utf8mb4, TLS when the DSN asks
for it, and capabilities only on request: ``LOAD DATA LOCAL INFILE`` (``infile``)
and multi-statements (``multi``) are off unless the caller is the shard writer
that needs them, so a rogue server can never read a file through the others.
Connecting is bounded by ``FARM_CONNECT_TIMEOUT`` (TCP connect *and* the server's
handshake), so an unroutable host or a server that accepts and never answers
fails in that time.

``translate`` turns a PyMySQL error into the ``FarmError`` tree. Messages name the
connection (``control``, ``legacy`` or the shard map's host name), user, host,
port and database, and the setting to check; they hide passwords and bind
values: quoted parts of a server message are kept only for error codes whose
quoted parts are identifiers (database, table, column, user names).
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from dataclasses import dataclass

import pymysql
from pymysql.constants import CLIENT

from shardfarm.errors import (
    ConfigError,
    FarmError,
    PermanentDatabaseError,
    TransientDatabaseError,
    UnreachableError,
)
from shardfarm.mysql.dsn import NAMES
from shardfarm.tuning import connect_timeout

# 2006 gone away, 2013 lost connection, 1213 deadlock, 1205 lock wait timeout,
# 1927 connection killed, 1053 server shutdown, 4031 idle disconnect, 2014 out of sync.
TRANSIENT_CODES = frozenset({2006, 2013, 1213, 1205, 1927, 1053, 4031, 2014, 2055, 1040})
UNREACHABLE_CODES = frozenset({2002, 2003})
HANDSHAKE_LOST = frozenset({2006, 2013, 2055})
# Codes whose quoted parts are identifiers (user, host, database, table, column, variable
# names), never data: their messages are kept as they are. Any other code is scrubbed.
IDENTIFIER_CODES = frozenset({
    1007, 1008, 1036, 1044, 1045, 1046, 1049, 1050, 1051, 1054, 1060, 1061, 1091, 1109,
    1114, 1129, 1130, 1142, 1143, 1146, 1153, 1193, 1226, 1227, 1229, 1231, 1238, 1364,
    1370, 1406, 1524, 1698, 2005, 2026, 2059,
})
# Codes an operator fixes in a setting (a user, password, database, host or TLS file).
SETTING_CODES = frozenset({1044, 1045, 1049, 1129, 1130, 1698, 2005, 2026, 2059})
# Unknown database or table: on the farm's own databases (control, shards, mod buckets, not
# the legacy source) 'farm shards init' makes them.
NOT_SET_UP = frozenset({1049, 1146})
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'")


@dataclass(frozen=True)
class Where:
    """Which connection: its name, user, server and database (never its password)."""

    name: str
    host: str
    port: int
    user: str
    database: str | None = None

    def __str__(self) -> str:
        db = f"/{self.database}" if self.database else ""
        return f"{self.name} ({self.user}@{self.host}:{self.port}{db})"

    @property
    def setting(self) -> str:
        """The variable (or shard map entry) an operator checks when this connection fails."""
        for variable, name in NAMES.items():
            if name == self.name:
                return variable
        return f"host {self.name} in the shard map (FARM_SHARDMAP)"


def scrub(code: int | None, text: str) -> str:
    """A server message on one line; quoted values replaced by ``'?'`` unless ``code``
    carries identifiers only (``Unknown database 'x'`` stays, ``Duplicate entry 'x'`` not)."""
    text = " ".join(str(text).split())
    if code not in IDENTIFIER_CODES:
        text = _QUOTED.sub("'?'", text)
    return text[:300]


class _Connection(pymysql.connections.Connection):
    """PyMySQL's connection, sharing one TLS context for its PREFERRED mode (no TLS asked
    for: encrypt when the server offers it, unverified). PyMySQL builds that context for
    every connection, loading the system's CA store each time (24 ms here, 100-250 ms on
    a busy machine: most of a small export part's cost). A context asked for by TLS
    settings is still built per connection (its files may change)."""

    _preferred: ssl.SSLContext | None = None

    def _create_ssl_ctx(self, sslp):
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        if _Connection._preferred is None:
            _Connection._preferred = super()._create_ssl_ctx({})
        return _Connection._preferred


UTC_SESSION = "SET SESSION time_zone = '+00:00'"  # see open_connection


def open_connection(where: Where, password: str, *, tls: dict | None = None,
                    infile: bool = False, multi: bool = False, timeout: float | None = None,
                    read_timeout: float | None = None, write_timeout: float | None = None,
                    session: str = "", **extra: object) -> pymysql.Connection:
    """A utf8mb4 connection to ``where``, within ``timeout`` (default FARM_CONNECT_TIMEOUT).

    Every session reads and writes times in UTC (``UTC_SESSION``), whatever the server's
    zone: leases are ``DATETIME`` values of the server's ``NOW(3)`` that sessions of many
    hosts write and compare, and a ``SYSTEM`` zone jumps an hour at daylight-saving changes
    (every lease would look expired at once, or live an hour too long). ``session``: more
    assignments for the same ``SET SESSION`` (``", a = 1, ..."``).

    ``infile`` allows ``LOAD DATA LOCAL INFILE`` and ``multi`` multi-statements: only the
    writers ask for them, and never both at once (a statement smuggled into a batch could
    then make the client send a file). ``read_timeout``/``write_timeout`` apply once
    connected.
    """
    if infile and multi:
        raise ValueError("a connection allows LOCAL INFILE or multi-statements, not both")
    budget = timeout or connect_timeout()
    for key in ("ssl_ca", "ssl_cert", "ssl_key"):
        if (tls or {}).get(key) and not os.access(tls[key], os.R_OK):
            raise ConfigError(f"cannot read {key} {tls[key]} for MySQL {where} "
                              f"(check {where.setting})")
    try:
        conn = _Connection(
            host=where.host, port=where.port, user=where.user, password=password,
            database=where.database, charset="utf8mb4", local_infile=infile,
            client_flag=CLIENT.MULTI_STATEMENTS if multi else 0, connect_timeout=budget,
            read_timeout=budget, write_timeout=budget, defer_connect=True,
            init_command=f"{UTC_SESSION}{session}",
            **(tls or {}), **extra)
    except (OSError, ValueError) as exc:  # TLS files missing or unreadable
        raise ConfigError(f"cannot set up TLS for MySQL {where}: {_reason(exc)} (check "
                          f"ssl_ca, ssl_cert and ssl_key in {where.setting})") from None
    try:
        conn.connect()
    except (pymysql.MySQLError, OSError) as exc:
        raise translate(exc, where, connecting=True, budget=budget) from None
    except RuntimeError as exc:
        if refused_infile(exc):
            raise translate(exc, where) from None
        raise
    # The handshake was bounded by the budget; from now on the caller's timeouts apply
    # (PyMySQL re-applies these on its next read or write).
    conn._read_timeout, conn._write_timeout = read_timeout, write_timeout
    return conn


def translate(exc: BaseException, where: Where | str, shard: int | None = None, *,
              connecting: bool = False, budget: float | None = None) -> FarmError:
    """Map a PyMySQL/OS error to an unreachable, transient or permanent ``DatabaseError``."""
    if isinstance(exc, FarmError):
        return exc
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    on = f"{where}" + (f", shard {shard}" if shard is not None else "")
    setting = where.setting if isinstance(where, Where) else "the connection's settings"
    kw = {"host": where.name if isinstance(where, Where) else where, "shard": shard,
          "code": code}
    failed = _not_connected(exc, code, on, setting, kw, connecting, budget)
    if failed is not None:
        return failed
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc) or type(exc).__name__
    msg = f"MySQL error {code} on {on}: {scrub(code, text)}"
    legacy = getattr(where, "name", "") == NAMES["FARM_LEGACY_DSN"]
    if code in NOT_SET_UP and not legacy:
        msg += f" (run 'farm shards init', or check {setting})"
    elif code in SETTING_CODES:
        msg += f" (check {setting})"
    elif code == 1146:  # the legacy source: 'farm shards init' does not make it
        msg += f" (check {setting}: the database it names lacks this legacy table)"
    if code in TRANSIENT_CODES or isinstance(exc, pymysql.err.InterfaceError):
        return TransientDatabaseError(msg, **kw)
    return PermanentDatabaseError(msg, **kw)


def _not_connected(exc: BaseException, code: int | None, on: str, setting: str, kw: dict,
                   connecting: bool, budget: float | None) -> FarmError | None:
    """The error for a refused file request, a failed TLS handshake or an unreachable
    server; ``None`` for an error the server itself reported."""
    if refused_infile(exc):
        return PermanentDatabaseError(
            f"MySQL {on} asked to read a local file (LOAD DATA LOCAL INFILE); refused: "
            "this connection never sends files", **kw)
    cause = getattr(exc, "original_exception", exc)
    if isinstance(cause, ssl.SSLError):
        return PermanentDatabaseError(f"TLS with MySQL {on} failed: {_reason(cause)} (check "
                                      f"ssl_ca and ssl_verify in {setting})", **kw)
    lost = connecting and code in HANDSHAKE_LOST
    if code in UNREACHABLE_CODES or lost or isinstance(exc, OSError):
        why = _reason(cause, budget, handshake=lost)
        return UnreachableError(f"cannot reach MySQL {on}: {why} (check {setting})", **kw)
    return None


def refused_infile(exc: BaseException) -> bool:
    """Whether ``exc`` is PyMySQL refusing a server's ``LOAD DATA LOCAL`` file request
    on a connection opened without ``infile`` (a ``RuntimeError``, not a MySQL error)."""
    return isinstance(exc, RuntimeError) and "LOAD_LOCAL" in str(exc)


def _reason(exc: BaseException, budget: float | None = None, handshake: bool = False) -> str:
    """Why a connection failed, in a few words (no addresses: the caller names them)."""
    limit = f" within FARM_CONNECT_TIMEOUT={budget:g} s" if budget else ""
    if isinstance(exc, pymysql.MySQLError):
        text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        if handshake:
            return (f"no MySQL handshake{limit}" if "timed out" in text
                    else "the server closed the connection during the handshake")
        return f"error {exc.args[0]}" if exc.args else type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer{limit}"
    if isinstance(exc, socket.gaierror):
        return "unknown host name"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message or exc.reason}"[:200]
    if isinstance(exc, ssl.SSLError):
        return " ".join(str(exc.reason or exc).split())[:200]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower() + (f": {exc.filename}" if exc.filename else "")
    return " ".join(str(exc).split())[:200] or type(exc).__name__
