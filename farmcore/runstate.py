"""A run's status, decided in one place: what a run that ended is called, and how every view
(``farm runs``, ``farm status``, the ``--wait`` bars and summary, the dashboard) says how it
ended.

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


def cancelled_line(run_id: str, not_done: int, cancelled_at: str | None) -> str:
    """``cancelled by the operator at T; N chunk(s) not done; …`` and how to take it up."""
    when = f" at {cancelled_at} UTC" if cancelled_at else ""
    return (f"cancelled by the operator{when}; {not_done:,} chunk(s) not done; "
            f"'farm retry-failed --run {run_id}' takes it up again")


def ending(run_id: str, status: str, chunks_failed: int, not_done: int,
           cancelled_at: str | None) -> str:
    """How a run that ended is told in full: ``done``, how and when it was cancelled, or how
    many chunks failed and what to run next."""
    if status == CANCELLED:
        return cancelled_line(run_id, not_done, cancelled_at)
    if not chunks_failed:
        return DONE
    return (f"ended with {chunks_failed:,} failed chunk(s): 'farm failed --run {run_id}' "
            f"says why, 'farm retry-failed --run {run_id}' tries them again")


def short_ending(status: str, chunks_failed: int, not_done: int) -> str:
    """How a run that ended is told in a few words (a progress bar, a table cell)."""
    if status == CANCELLED:
        return f"cancelled, {not_done:,} not done"
    return f"ended, {chunks_failed:,} failed" if chunks_failed else DONE
