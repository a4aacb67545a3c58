"""Legacy DATETIME text (UTC) to the target's ISO string and unix-seconds sequence."""

from __future__ import annotations

import datetime as dt
import functools

_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()


@functools.lru_cache(maxsize=1 << 17)
def parse(text: str) -> tuple[str, int] | None:
    """``('2013-04-05T06:07:08Z', 1365142028)``, or ``None`` for a zero or invalid date.

    The text is UTC: a zone it may carry is ignored, as MariaDB's DATETIME has none (only
    the date and the time of day are read, never the zone: no ``replace(tzinfo=None)``,
    which cost more than the parse itself).
    """
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    # whole days and seconds of the day (the microseconds only ever round down): a
    # timedelta's floor division costs three times the parse itself
    seconds = ((value.toordinal() - _EPOCH_DAY) * 86400 + value.hour * 3600
               + value.minute * 60 + value.second)
    if len(text) == 19 and text[10] == " ":  # MariaDB's DATETIME text: no re-formatting
        return f"{text[:10]}T{text[11:]}Z", seconds
    return value.strftime("%Y-%m-%dT%H:%M:%SZ"), seconds


def iso(text: str) -> str:
    """ISO-8601 UTC text of a valid legacy DATETIME."""
    return parse(text)[0]


def unix(text: str) -> int:
    """Unix seconds of a valid legacy DATETIME."""
    return parse(text)[1]
