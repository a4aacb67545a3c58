"""Lines joined by the server, one row per group, and how to tell which it cut.

``SELECT COUNT(*), key, GROUP_CONCAT(CONCAT(line, END) SEPARATOR '') … GROUP BY key``
sends a row per group instead of a row per line (the client decodes far fewer rows). The
server cuts a joined value at ``group_concat_max_len`` (and gives NULL past
``max_allowed_packet``). With every line ending in ``END`` (which no line holds), a group
is whole exactly when its value ends in ``END`` and holds ``COUNT(*)`` of them: a cut
loses a line or leaves the last one without its end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

Text = TypeVar("Text", str, bytes)


def split_joined(groups: Iterable[tuple[int, int, Text | None]], end: Text
                 ) -> tuple[list[Text], int, list[int]]:
    """Of ``(lines, key, joined)`` rows: the whole groups' values, how many lines they
    hold, and the keys of the groups the server cut (to read again line by line)."""
    whole: list[Text] = []
    rows, cut = 0, []
    for n, key, joined in groups:
        if joined is not None and joined.endswith(end) and joined.count(end) == n:
            whole.append(joined)
            rows += n
        else:
            cut.append(int(key))
    return whole, rows, cut
