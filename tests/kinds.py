"""Functions the tests enqueue (importable by real worker processes)."""

from rq import get_current_job

from shardfarm.errors import FatalError


def record(key: str, value: int) -> None:
    """Record ``key -> value`` in the job's Redis; a negative value is bad input."""
    if value < 0:
        raise FatalError(f"negative value for {key}")
    get_current_job().connection.hset("test:record", key, value)
