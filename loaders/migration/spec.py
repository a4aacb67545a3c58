"""The migration spec: one declaration per legacy table drives load, verify and quarantine.

For each legacy table: its key, the object type it becomes (if any), the fields
copied into the JSON document, its references (each to another legacy table,
becoming a new 64-bit ID), what it needs to be valid, where it is placed, and
the mapping rows and mod-shard lookups it produces. A new legacy table or a new
mapping table is a few lines here.
"""

from __future__ import annotations

from dataclasses import dataclass

SELF = "self"
RANDOM = "random"


@dataclass(frozen=True)
class Ref:
    """A column holding a legacy ID of ``table``; ``role`` names it in quarantine reasons."""

    field: str
    table: str
    role: str


@dataclass(frozen=True)
class Mapping:
    """A mapping row ``from -> to`` (each ``SELF`` or a ref field), sequenced by ``created_at``."""

    table: str
    from_: str
    to: str


@dataclass(frozen=True)
class Lookup:
    """A mod-shard lookup keyed by the lower-cased ``field``; ties keep the smallest user ID."""

    table: str
    field: str


@dataclass(frozen=True)
class LegacyTable:
    """How one legacy table migrates."""

    name: str
    key: tuple[str, ...]
    fields: tuple[str, ...]
    refs: tuple[Ref, ...] = ()
    type_name: str | None = None
    required: tuple[str, ...] = ("created_at",)
    placement: str | None = None
    mappings: tuple[Mapping, ...] = ()
    lookups: tuple[Lookup, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Legacy columns read for this table, key first."""
        rest = [f for f in (*self.fields, *(r.field for r in self.refs)) if f not in self.key]
        return tuple(dict.fromkeys([*self.key, *rest]))

    @property
    def judge_columns(self) -> tuple[str, ...]:
        """The columns needed to judge and place a referenced row (no long text fields: the
        key, required fields, lookup fields, whose length is judged, and references)."""
        return tuple(dict.fromkeys([*self.key, *self.required, *(lk.field for lk in self.lookups),
                                    *(r.field for r in self.refs)]))

    @property
    def is_object(self) -> bool:
        """Whether rows become objects (else they only produce mapping rows)."""
        return self.type_name is not None

    def ref(self, field: str) -> Ref:
        """The reference held in ``field``."""
        return next(r for r in self.refs if r.field == field)

    def doc_fields(self) -> tuple[str, ...]:
        """Keys of the object's JSON document: ``legacy_id``, then the fields in spec order."""
        return ("legacy_id", *self.fields)


SPEC: dict[str, LegacyTable] = {t.name: t for t in [
    LegacyTable(
        "users", ("id",), ("username", "email", "full_name", "created_at"),
        type_name="user", required=("username", "created_at"), placement=RANDOM,
        lookups=(Lookup("username_to_user", "username"), Lookup("email_to_user", "email"))),
    LegacyTable(
        "boards", ("id",), ("user_id", "name", "description", "created_at"),
        refs=(Ref("user_id", "users", "owner"),), type_name="board", placement="user_id",
        mappings=(Mapping("user_has_boards", "user_id", SELF),)),
    LegacyTable(
        "pins", ("id",), ("user_id", "board_id", "details", "link", "image_url", "created_at"),
        refs=(Ref("user_id", "users", "pinner"), Ref("board_id", "boards", "board")),
        type_name="pin", placement="board_id",
        mappings=(Mapping("user_has_pins", "user_id", SELF),
                  Mapping("board_has_pins", "board_id", SELF))),
    LegacyTable(
        "comments", ("id",), ("pin_id", "user_id", "body", "created_at"),
        refs=(Ref("pin_id", "pins", "pin"), Ref("user_id", "users", "author")),
        type_name="comment", placement="pin_id",
        mappings=(Mapping("pin_has_comments", "pin_id", SELF),)),
    LegacyTable(
        "follows", ("user_id", "board_id"), ("created_at",),
        refs=(Ref("user_id", "users", "user"), Ref("board_id", "boards", "board")),
        mappings=(Mapping("user_follows_boards", "user_id", "board_id"),)),
    LegacyTable(
        "likes", ("user_id", "pin_id"), ("created_at",),
        refs=(Ref("user_id", "users", "user"), Ref("pin_id", "pins", "pin")),
        mappings=(Mapping("user_likes_pins", "user_id", "pin_id"),)),
]}

ORDER: tuple[str, ...] = tuple(SPEC)  # dispatch order only; chunks never wait for each other


def legacy_key(table: LegacyTable, row: dict) -> str:
    """The legacy key as quarantine and verify print it: ``42`` or ``7:42``."""
    return ":".join(str(row[k]) for k in table.key)
