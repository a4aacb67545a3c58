"""Row images of a binlog rows event reduced to a few columns, decoded straight from the
event's bytes.

``pymysqlreplication`` decodes every column of every row image (text included) through a
chain of method calls per value: that was over half of what ``farm sync``'s binlog reader
spends. ``farm sync`` looks at a few columns of each change (keys, owners, a username,
a date), so for the column types of the legacy schema this module walks the row bytes
itself: it skips the other columns by their length and decodes only the wanted ones,
to the values ``pymysqlreplication`` would give. Any other layout (another column type,
text in a character set other than UTF-8, a fractional-second date, a partial row image,
a table whose columns are not the legacy schema's) returns ``None`` before a byte is
read, and the caller decodes the event the library's way.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from pymysqlreplication.constants import FIELD_TYPE

from loaders.migration.legacy_schema import LEGACY_COLUMNS

INT, TEXT, SKIP_TEXT, DATETIME2 = 0, 1, 2, 3
DATETIME2_BYTES = 5
UTF8 = (None, "utf8", "utf8mb3", "utf8mb4")  # None: not logged (no binlog_row_metadata=FULL)


def _plan(ev, wanted: Sequence[str]) -> list[tuple[int, int, str | None]] | None:
    """Per column: how to read it (``INT``/``TEXT``/``SKIP_TEXT``/``DATETIME2``), its size
    (integer bytes or length-prefix bytes) and its name if wanted; ``None`` if a column
    is of a type or layout read here only by the library."""
    names = LEGACY_COLUMNS.get(ev.table)
    if names is None or len(ev.columns) != len(names):
        return None
    plan: list[tuple[int, int, str | None]] = []
    for col, name in zip(ev.columns, names, strict=True):  # the table map's columns
        if col.name and col.name != name:
            return None  # names logged (binlog_row_metadata=FULL) in another order
        keep = name if name in wanted else None
        if getattr(col, "character_set_name", None) not in UTF8:
            return None  # text logged in another character set: the library decodes it
        if col.type == FIELD_TYPE.LONGLONG:
            plan.append((INT, 8, keep))
        elif col.type == FIELD_TYPE.VARCHAR:
            plan.append((TEXT if keep else SKIP_TEXT, 2 if col.max_length > 255 else 1, keep))
        elif col.type == FIELD_TYPE.BLOB:
            plan.append((TEXT if keep else SKIP_TEXT, col.length_size, keep))
        elif col.type == FIELD_TYPE.DATETIME2 and not getattr(col, "fsp", 0):
            plan.append((DATETIME2, DATETIME2_BYTES, keep))
        else:
            return None
    return plan


def _all_present(bitmap: bytes, n: int) -> bool:
    return all(_present(bitmap, i) for i in range(n))


def _present(bitmap: bytes, i: int) -> bool:
    return bool(bitmap[i >> 3] >> (i & 7) & 1)


def _bitmaps(ev) -> list[bytes]:
    """The columns-present bitmap of each image the event's rows carry."""
    if type(ev).__name__ == "UpdateRowsEvent":
        return [ev.columns_present_bitmap, ev.columns_present_bitmap2]
    return [ev.columns_present_bitmap]


def missing(ev, wanted: Sequence[str]) -> list[str]:
    """The ``wanted`` columns that one of the rows event's images does not carry (a partial
    image, written by a session with ``binlog_row_image=MINIMAL``): the library would give
    them as ``None``, which is not their value. Columns are named as logged, else by the
    legacy schema's order."""
    order = LEGACY_COLUMNS.get(ev.table, ())
    bitmaps = _bitmaps(ev)
    out: list[str] = []
    for i, col in enumerate(ev.columns):
        name = col.name or (order[i] if i < len(order) else None)
        if name in wanted and not all(_present(b, i) for b in bitmaps):
            out.append(name)
    return out


def reduced_rows(ev, wanted: Sequence[str]) -> list[tuple[dict | None, dict | None]] | None:
    """``(before, after)`` images of every row of a write, update or delete rows event,
    holding the ``wanted`` columns only (``None`` for the image an insert or a delete
    lacks); ``None`` when the event must be decoded by the library (nothing read then).
    Integers are read unsigned: the legacy schema's are all ``BIGINT UNSIGNED`` (a
    narrower integer column goes the library's way)."""
    kind = type(ev).__name__
    if kind not in ("WriteRowsEvent", "DeleteRowsEvent", "UpdateRowsEvent"):
        return None
    plan = _plan(ev, wanted)
    if plan is None or not all(_all_present(b, len(plan)) for b in _bitmaps(ev)):
        return None
    data = ev.packet.read(ev.event_size - ev.packet.read_bytes)
    images: list[dict] = []
    pos, end, null_bytes = 0, len(data), (len(plan) + 7) // 8
    while pos < end:
        image, pos = _image(data, pos, plan, null_bytes)
        images.append(image)
    if kind == "UpdateRowsEvent":
        return list(zip(images[0::2], images[1::2], strict=True))
    if kind == "WriteRowsEvent":
        return [(None, image) for image in images]
    return [(image, None) for image in images]


def _image(data: bytes, pos: int, plan: list[tuple[int, int, str | None]], null_bytes: int
           ) -> tuple[dict, int]:
    """One row image from ``data[pos:]``: the wanted values, and where the next begins."""
    nulls = int.from_bytes(data[pos:pos + null_bytes], "little")
    pos += null_bytes
    out: dict = {}
    for i, (how, size, name) in enumerate(plan):
        if nulls >> i & 1:
            if name:
                out[name] = None
            continue
        if how in (INT, DATETIME2):
            if name:
                raw = data[pos:pos + size]
                out[name] = (int.from_bytes(raw, "little") if how == INT
                             else _datetime2(int.from_bytes(raw, "big")))
            pos += size
            continue
        length = int.from_bytes(data[pos:pos + size], "little")
        pos += size
        if how == TEXT:
            out[name] = text(data[pos:pos + length])
        pos += length
    if pos > len(data):
        raise ValueError("a binlog row image ends past its event")
    return out, pos


def text(raw: bytes) -> str:
    """Followed text as UTF-8, or, when its bytes are not UTF-8, as Latin-1: a server that
    logs no character sets (``binlog_row_metadata=NO_LOG``, MariaDB's default) leaves a
    latin1 column's bytes unnamed, and its values must still come out (and compare) as
    they are; a Latin-1 reading of other bytes keeps different values different."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _datetime2(v: int) -> datetime.datetime | None:
    """A ``DATETIME(0)`` value as MySQL 5.6+ stores it (40 bits, big-endian: sign, year*13 +
    month, day, hour, minute, second); ``None`` for a date Python cannot hold (zero)."""
    year_month = v >> 22 & 0x1FFFF
    try:
        return datetime.datetime(year_month // 13, year_month % 13, v >> 17 & 0x1F,
                                 v >> 12 & 0x1F, v >> 6 & 0x3F, v & 0x3F)
    except ValueError:
        return None
