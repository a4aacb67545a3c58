"""No-op job function used by the reference benchmarks."""

from __future__ import annotations

from farmcore.ledger import Outcome


def noop(**kwargs: object) -> None:
    """Do nothing; the job body whose cost the benchmarks want to be zero."""
    return None


def noop_chunk(ctx: object, **kwargs: object) -> Outcome:
    """A chunk handler that does nothing: a run of these costs only the ledger and queue."""
    return Outcome()
