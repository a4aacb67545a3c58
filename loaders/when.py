"""Legacy DATETIME text (UTC) to the target's ISO string and unix-seconds sequence."""

from __future__ import annotations

import datetime as dt
import functools


@functools.lru_cache(maxsize=1 << 17)
def parse(text: str) -> tuple[str, int] | None:
    """``('2013-04-05T06:07:08Z', 1365142028)``, or ``None`` for a zero or invalid date."""
    try:
        value = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    if len(text) == 19 and text[10] == " ":  # MariaDB's DATETIME text: no re-formatting
        return f"{text[:10]}T{text[11:]}Z", int(value.timestamp())
    return value.strftime("%Y-%m-%dT%H:%M:%SZ"), int(value.timestamp())


def iso(text: str) -> str:
    """ISO-8601 UTC text of a valid legacy DATETIME."""
    return parse(text)[0]


def unix(text: str) -> int:
    """Unix seconds of a valid legacy DATETIME."""
    return parse(text)[1]
