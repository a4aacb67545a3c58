"""The legacy server's binary log as ``farm sync`` reads it: server checks, positions, and a
stream of row changes in transaction order (``pymysqlreplication``, MariaDB GTIDs).

A position is MariaDB's ``gtid_binlog_pos`` text (``domain-server-seq`` per domain,
comma separated). The stream reports a position only at the end of a transaction, so a
checkpoint never falls inside one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from loaders.migration import rowimage
from loaders.migration.legacy import LegacyReader
from loaders.migration.legacy_schema import LEGACY_COLUMNS
from shardfarm.errors import ConfigError, FatalError
from shardfarm.mysql.dsn import DSN

UNSIGNED = 1 << 64
UNNAMED = "UNKNOWN_COL"  # pymysqlreplication's name for a column the server did not name
PURGED = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG: the position is no longer there
HOW_TO_ENABLE = ("set log_bin=ON and binlog_format=ROW in its server config ([mysqld] "
                 "log_bin, binlog_format=ROW) and restart it")


class PurgedPositionError(FatalError):
    """The binlog position to resume from is no longer on the server: a full re-run is
    needed (retrying cannot help)."""


class MalformedPositionError(ConfigError):
    """A position text that is not MariaDB's ``domain-server-seq`` list (a value written
    into the control database by hand or by anyone, never by ``farm sync``)."""


class PartialImageError(FatalError):
    """A row image lacks a column sync decides by (written by a session with
    ``binlog_row_image=MINIMAL``): what it changed cannot be known from the log."""


Columns = Mapping[str, Sequence[str]]  # the tables to follow, and the columns kept of each


@dataclass(frozen=True)
class Change:
    """One row change: legacy table, images before and after (``None`` for insert/delete)
    holding the columns followed."""

    table: str
    before: dict | None
    after: dict | None


@dataclass(frozen=True)
class Mark:
    """The end of a transaction (``position`` then includes it) or an idle heartbeat."""

    position: str
    timestamp: int
    idle: bool = False


def check_server(reader: LegacyReader) -> None:
    """Refuse a legacy server whose binary log cannot be followed (one line, how to fix):
    none, not row-based, compressed (``pymysqlreplication`` does not know MariaDB's
    compressed row events and would skip them: changes lost), or with ``MINIMAL`` row
    images (an update's after image lacks the key)."""
    (log_bin, fmt, compress, image), = reader.query(
        "SELECT @@log_bin, @@binlog_format, @@log_bin_compress, @@binlog_row_image")
    where = f"the legacy server {reader.dsn.host}:{reader.dsn.port}"
    if not int(log_bin) or str(fmt).upper() != "ROW":
        raise ConfigError(f"{where} has log_bin={'ON' if int(log_bin) else 'OFF'}, "
                          f"binlog_format={fmt}: farm sync needs a row-based binary log; "
                          f"{HOW_TO_ENABLE}")
    if int(compress):
        raise ConfigError(f"{where} has log_bin_compress=ON: farm sync cannot read compressed "
                          "row events; SET GLOBAL log_bin_compress=OFF (and in its config)")
    if str(image).upper() == "MINIMAL":
        raise ConfigError(f"{where} has binlog_row_image=MINIMAL: farm sync needs whole row "
                          "images; SET GLOBAL binlog_row_image=FULL (and in its config)")


def followable_position(reader: LegacyReader) -> str | None:
    """The position now if the server writes a row-based binary log, else ``None``."""
    (log_bin, fmt, pos), = reader.query("SELECT @@log_bin, @@binlog_format, @@gtid_binlog_pos")
    return str(pos or "") if int(log_bin) and str(fmt).upper() == "ROW" else None


def current_position(reader: LegacyReader) -> str:
    """The server's ``gtid_binlog_pos`` now."""
    return str(reader.query("SELECT @@gtid_binlog_pos")[0][0] or "")


def parse(position: str) -> dict[int, tuple[int, int]]:
    """``{domain: (server, seq)}`` of a position text; ``MalformedPositionError`` for any
    other text (or a value that is no text)."""
    if not isinstance(position, str):
        raise MalformedPositionError(f"binlog position {str(position)[:64]!r} is not a text "
                                     "(domain-server-seq, comma separated)")
    out = {}
    for part in filter(None, (p.strip() for p in position.split(","))):
        try:
            domain, server, seq = (int(x) for x in part.split("-"))
        except ValueError:
            raise MalformedPositionError(
                f"binlog position {position[:64]!r} is malformed (expected "
                "domain-server-seq, comma separated)") from None
        out[domain] = (server, seq)
    return out


def stored(position: str, where: str) -> str:
    """``position``, read from ``where`` (a column of the control database), once it is a
    binlog position; else a ``MalformedPositionError`` naming it and how to recover."""
    try:
        parse(position)
    except MalformedPositionError:
        raise MalformedPositionError(
            f"{where} holds {str(position)[:64]!r}, not a binlog position (domain-server-seq, "
            "comma separated; farm sync never writes that): set it to NULL, run 'farm "
            "migrate --wait' again, then 'farm sync'") from None
    return position


def render(pos: dict[int, tuple[int, int]]) -> str:
    """Position text of ``{domain: (server, seq)}``."""
    return ",".join(f"{d}-{s}-{q}" for d, (s, q) in sorted(pos.items()))


def behind(applied: str, current: str) -> int:
    """Transactions in ``current`` not yet in ``applied`` (summed over domains)."""
    a = parse(applied)
    return sum(max(0, q - a.get(d, (0, 0))[1]) for d, (_, q) in parse(current).items())


def stream(dsn: DSN, start: str, columns: Columns, heartbeat: float = 1.0
           ) -> Iterator[Change | Mark]:
    """Row changes of ``dsn``'s database from ``start`` on (of the tables in ``columns``,
    images reduced to their columns there), a ``Mark`` after each transaction and when
    idle; blocks waiting for more. ``PurgedPositionError`` when the server no longer has
    ``start``."""
    # its advice to log column names (binlog_row_metadata=FULL) is handled here: ``named``
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    conn = {"host": dsn.host, "port": dsn.port, "user": dsn.user, "password": dsn.password or "",
            **dsn.tls_args()}  # the DSN's TLS settings, as every other connection to it
    reader = BinLogStreamReader(
        connection_settings=conn, server_id=random.randint(10**6, 2**31), blocking=True,
        is_mariadb=True, auto_position=start, resume_stream=True, slave_heartbeat=heartbeat,
        only_schemas=[dsn.database], enable_logging=False,
        # text it decodes as UTF-8 when no character set is logged: a latin1 column's
        # bytes would stop the stream (``rowimage.text`` reads them as Latin-1 instead)
        ignore_decode_errors=True,
        only_events=[MariadbGtidEvent, XidEvent, HeartbeatLogEvent, WriteRowsEvent,
                     UpdateRowsEvent, DeleteRowsEvent])
    pos = parse(start)
    try:
        yield from _events(reader, pos, columns)
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == PURGED:
            said = (str(exc.args[1]).splitlines() or [""])[0][:200] if len(exc.args) > 1 \
                else ""
            raise PurgedPositionError(
                f"the legacy server cannot send binlog position {start or '(empty)'}: it was "
                f"purged, or is past what the server holds (it says: {said}); a full re-run "
                "is needed ('farm migrate --wait', then 'farm sync')") from None
        raise
    finally:
        reader.close()


def _events(reader: BinLogStreamReader, pos: dict, columns: Columns
            ) -> Iterator[Change | Mark]:
    pending: tuple[int, int, int] | None = None
    for ev in reader:
        if isinstance(ev, MariadbGtidEvent):
            if pending is not None:  # a group without an XID (DDL): complete as well
                pos[pending[0]] = pending[1:]
            pending = (ev.domain_id, ev.server_id, ev.gtid_seq_no)
        elif isinstance(ev, XidEvent):
            if pending is not None:
                pos[pending[0]] = pending[1:]
                pending = None
            yield Mark(render(pos), ev.timestamp)
        elif isinstance(ev, HeartbeatLogEvent):
            yield Mark(render(pos), 0, idle=True)
        elif ev.table in columns:
            yield from _rows(ev, columns[ev.table], pos)


def _rows(ev, wanted: Sequence[str], pos: dict) -> Iterator[Change]:
    """The event's row changes, read straight from its bytes where ``rowimage`` can, else
    decoded by the library and reduced; ``PartialImageError`` if an image lacks one of the
    ``wanted`` columns (``pos``: the last transaction before the event)."""
    t = ev.table
    fast = rowimage.reduced_rows(ev, wanted)
    if fast is not None:
        for before, after in fast:
            yield Change(t, before, after)
        return
    lacking = rowimage.missing(ev, wanted)
    if lacking:
        raise PartialImageError(
            f"the legacy binlog holds a partial row image of {t} without "
            f"{', '.join(lacking)} (after position {render(pos) or '(start)'}): a client "
            "wrote with SET SESSION binlog_row_image=MINIMAL, and sync needs the columns it "
            "decides by in every image (as gh-ost and Vitess do); make every client log FULL "
            "or NOBLOB images, then run 'farm migrate --wait' and 'farm sync' again")
    for row in ev.rows:
        if isinstance(ev, WriteRowsEvent):
            yield Change(t, None, _kept(t, row["values"], wanted))
        elif isinstance(ev, DeleteRowsEvent):
            yield Change(t, _kept(t, row["values"], wanted), None)
        else:
            yield Change(t, _kept(t, row["before_values"], wanted),
                         _kept(t, row["after_values"], wanted))


def _kept(table: str, values: dict, wanted: Sequence[str]) -> dict:
    image = named(table, values)
    return {c: image[c] for c in wanted if c in image}


def named(table: str, values: dict) -> dict:
    """A row image keyed by column name. Without ``binlog_row_metadata=FULL`` the server
    logs no names (``UNKNOWN_COL0``, ...): the legacy schema's column order names them.
    Logged names are kept as they are, whatever the order (a column the legacy schema
    does not have is only carried along)."""
    cols = LEGACY_COLUMNS.get(table)
    if cols is None:
        return values
    if any(str(k).startswith(UNNAMED) for k in values):
        values = {cols[i]: v for i, v in enumerate(values.values()) if i < len(cols)}
    # ...nor signedness: every integer column of the legacy schema is BIGINT UNSIGNED
    return {k: v + UNSIGNED if isinstance(v, int) and v < 0 else v for k, v in values.items()}
