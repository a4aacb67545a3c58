"""A run's status, decided in one place: what a run that ended is called, for every view
(``farm runs``, ``farm status``, the ``--wait`` bars and summary, the dashboard).

A run is ``running`` while a chunk of it is pending or running. Once none is, it is
``cancelled`` if ``farm cancel`` ended it (``runs.cancelled_at``: ``farm retry-failed --run``
takes it up again and clears it), else ``failed`` if a chunk failed, else ``done``.
``farmcore.ledger.Ledger.refresh_status`` stores that in ``runs.status``; every reader goes
by the stored status.
"""

from __future__ import annotations

RUNNING = "running"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"
ENDED = (DONE, FAILED, CANCELLED)  # no chunk pending or running
FELL_SHORT = (FAILED, CANCELLED)  # ended with a chunk not done


def ended_status(chunks_failed: int, cancelled: bool) -> str:
    """The status of a run none of whose chunks is pending or running: ``cancelled`` when
    ``farm cancel`` ended it, ``failed`` when a chunk failed, else ``done``."""
    if cancelled:
        return CANCELLED
    return FAILED if chunks_failed else DONE


def has_ended(status: str) -> bool:
    """Whether a run of this status has ended (done, failed or cancelled)."""
    return status in ENDED


def fell_short(status: str) -> bool:
    """Whether a run of this status ended with a chunk not done (failed or cancelled)."""
    return status in FELL_SHORT
