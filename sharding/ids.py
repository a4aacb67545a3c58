"""The 64-bit ID: ``(shard << 46) | (type << 36) | local`` with the top two bits zero."""

from __future__ import annotations

import re
from typing import NamedTuple

from shardfarm.errors import InvalidIdError

SHARD_BITS, TYPE_BITS, LOCAL_BITS = 16, 10, 36
MAX_SHARD = (1 << SHARD_BITS) - 1
MAX_TYPE = (1 << TYPE_BITS) - 1
MAX_LOCAL = (1 << LOCAL_BITS) - 1
MAX_ID = (1 << (SHARD_BITS + TYPE_BITS + LOCAL_BITS)) - 1
SHARD_SHIFT = TYPE_BITS + LOCAL_BITS
TYPE_SHIFT = LOCAL_BITS
# The local ID space is split in two: a legacy ID below FIRST_ALLOCATED is
# its own local ID; the shard's AUTO_INCREMENT hands out the rest, from FIRST_ALLOCATED up.
FIRST_ALLOCATED = 1 << (LOCAL_BITS - 1)

_ID_TEXT = re.compile(r"0[xX][0-9a-fA-F]{1,16}|[0-9]{1,20}")  # an ID as text: ASCII only
TYPES: dict[str, int] = {"pin": 1, "board": 2, "user": 3, "comment": 4}
TYPE_NAMES: dict[int, str] = {v: k for k, v in TYPES.items()}


class DecodedId(NamedTuple):
    """The parts of a 64-bit ID."""

    id: int
    shard: int
    type: int
    local: int

    @property
    def type_name(self) -> str:
        """The type's name (``pin``), or ``type<N>`` for a type not yet named."""
        return TYPE_NAMES.get(self.type, f"type{self.type}")

    def as_dict(self) -> dict:
        """The JSON shape printed by ``farm id decode``."""
        return {"id": self.id, "shard": self.shard, "type": self.type,
                "type_name": self.type_name, "local": self.local}


def type_id(type_: int | str) -> int:
    """Resolve a type name or number to its number, checking the range."""
    if isinstance(type_, str):
        if type_ in TYPES:
            return TYPES[type_]
        if not (type_.isascii() and type_.isdigit()):
            raise InvalidIdError(f"unknown type {type_!r} (known: {', '.join(TYPES)})")
        type_ = int(type_)
    if not 0 <= type_ <= MAX_TYPE:
        raise InvalidIdError(f"type {type_} out of range 0..{MAX_TYPE}")
    return type_


def encode(shard: int, type_: int | str, local: int) -> int:
    """Pack shard, type and local ID into one 64-bit ID."""
    t = type_id(type_)
    if not 0 <= shard <= MAX_SHARD:
        raise InvalidIdError(f"shard {shard} out of range 0..{MAX_SHARD}")
    if not 1 <= local <= MAX_LOCAL:
        raise InvalidIdError(f"local id {local} out of range 1..{MAX_LOCAL}")
    return (shard << SHARD_SHIFT) | (t << TYPE_SHIFT) | local


def decode(id_: int) -> DecodedId:
    """Split a 64-bit ID into its parts, refusing reserved bits and a zero local ID."""
    if isinstance(id_, bool) or not isinstance(id_, int):
        raise InvalidIdError(f"id must be an integer, not {type(id_).__name__}")
    if id_ < 0:
        raise InvalidIdError(f"id {id_} is negative")
    if id_ > MAX_ID:
        raise InvalidIdError(f"id {id_} sets the reserved top bits (max {MAX_ID})")
    local = id_ & MAX_LOCAL
    if local == 0:
        raise InvalidIdError(f"id {id_} has local id 0")
    return DecodedId(id_, id_ >> SHARD_SHIFT, (id_ >> TYPE_SHIFT) & MAX_TYPE, local)


def parse(text: str) -> DecodedId:
    """Parse a decimal (or 0x hex) ID from text and decode it: ASCII digits only (Python's
    ``int`` would also take ``1_000`` and other scripts' digits)."""
    s = text.strip()
    if not _ID_TEXT.fullmatch(s):
        raise InvalidIdError(f"not an integer id: {text[:40]!r}")
    return decode(int(s, 16) if s[:2] in ("0x", "0X") else int(s, 10))


def shard_of(id_: int) -> int:
    """The shard an ID lives on (no validation; hot path)."""
    return id_ >> SHARD_SHIFT
