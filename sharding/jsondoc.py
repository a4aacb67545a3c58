"""JSON documents stored in object tables: orjson, UTF-8, objects only."""

from __future__ import annotations

import orjson


def dumps(doc: dict) -> str:
    """Encode a document as compact JSON text (non-ASCII kept as UTF-8)."""
    return orjson.dumps(doc).decode("utf-8")


def loads(text: str | bytes) -> dict:
    """Decode a stored document."""
    return orjson.loads(text)
