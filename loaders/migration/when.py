"""Legacy DATETIME text (UTC) to the target's ISO string and unix-seconds sequence."""

from __future__ import annotations

import datetime as dt
import functools

_EPOCH = dt.datetime(1970, 1, 1)
_SECOND = dt.timedelta(seconds=1)


@functools.lru_cache(maxsize=1 << 17)
def parse(text: str) -> tuple[str, int] | None:
    """``('2013-04-05T06:07:08Z', 1365142028)``, or ``None`` for a zero or invalid date.

    The text is UTC: a zone it may carry is ignored, as MariaDB's DATETIME has none.
    """
    try:
        value = dt.datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        return None
    seconds = (value - _EPOCH) // _SECOND
    if len(text) == 19 and text[10] == " ":  # MariaDB's DATETIME text: no re-formatting
        return f"{text[:10]}T{text[11:]}Z", seconds
    return value.strftime("%Y-%m-%dT%H:%M:%SZ"), seconds


def iso(text: str) -> str:
    """ISO-8601 UTC text of a valid legacy DATETIME."""
    return parse(text)[0]


def unix(text: str) -> int:
    """Unix seconds of a valid legacy DATETIME."""
    return parse(text)[1]
