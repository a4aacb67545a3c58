"""No-op job function used by the reference benchmarks."""

from __future__ import annotations


def noop(**kwargs: object) -> None:
    """Do nothing; the job body whose cost the benchmarks want to be zero."""
    return None
