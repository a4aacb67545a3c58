"""How the chunks and items of the job a worker runs ended, noted in the process as they end.

A worker collects the notes of each job (``start`` before it, ``take`` after it) for whoever
asked for them: a ``farm workers --burst`` supervisor counts what its workers ran that did not
succeed (``workers.burst``). Outside a worker's job nothing is kept. One thing noted twice in
a job keeps its worst end.
"""

from __future__ import annotations

FAILED, RETRYING, DONE = "failed", "retrying", "done"
_RANK = {DONE: 0, RETRYING: 1, FAILED: 2}
_ended: dict[str, tuple[str, str]] | None = None


def start() -> None:
    """Collect the notes of the job about to run (those of an earlier job are dropped)."""
    global _ended
    _ended = {}


def note(key: str, kind: str, outcome: str) -> None:
    """``key`` (an item or chunk ID, ``job:<id>``), a ``kind`` (``chunk``, ``item``, ``job``)
    ended ``outcome``: ``done``, ``failed`` (for good) or ``retrying`` (to be tried again)."""
    if _ended is None:
        return
    had = _ended.get(key)
    if had is None or _RANK[outcome] >= _RANK[had[1]]:
        _ended[key] = (kind, outcome)


def take() -> dict[str, tuple[str, str]]:
    """Every end noted since ``start``: key -> ``(kind, outcome)``; collecting stops."""
    global _ended
    ended, _ended = _ended or {}, None
    return ended
