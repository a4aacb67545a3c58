"""Comma-separated lists as operators type them (``--tables pins,boards``, ``--queues a,b``):
one parser, so that an empty list is refused everywhere instead of meaning "everything" in
one place and "nothing" in another."""

from __future__ import annotations

from shardfarm.errors import UsageError


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
