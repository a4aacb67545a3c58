"""Comma-separated lists as operators type them (``--tables pins,boards``, ``--queues a,b``):
one parser, so that an empty list is refused everywhere instead of meaning "everything" in
one place and "nothing" in another."""

from __future__ import annotations

import re

from shardfarm.errors import UsageError

_QUEUE = re.compile(r"[^\s,]{1,200}")


def names(text: str, what: str) -> list[str]:
    """``A,B,...`` as a list of stripped, non-empty items, in their order.

    ``UsageError`` (one line naming ``what``, e.g. ``--tables``) for a list with nothing in
    it (``''``, ``','``) or with an empty item (``'a,,b'``, ``'a,'``).
    """
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise UsageError(f"bad {what} {text[:80]!r}: the list is empty "
                         f"(leave {what} out for the default)")
    if not all(items):
        raise UsageError(f"bad {what} {text[:80]!r}: an empty item between commas")
    return items


def queue(text: str, what: str = "QUEUE") -> str:
    """``text`` as a queue name: one word of at most 200 characters, without spaces or commas
    (``farm workers --queues`` could not name it: its items would wait for ever), else a
    ``UsageError`` naming ``what``."""
    if not _QUEUE.fullmatch(text):
        raise UsageError(f"bad {what} {text[:80]!r}: a queue name is one word without spaces "
                         "or commas, e.g. farm")
    return text


def queues(text: str, what: str = "--queues") -> list[str]:
    """``Q1,Q2,...`` as a list of queue names (``names``, each one checked by ``queue``)."""
    return [queue(q, what) for q in names(text, what)]
