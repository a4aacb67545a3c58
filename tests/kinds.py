"""Functions the tests enqueue (importable by real worker processes)."""

from rq import get_current_job

from shardfarm.errors import FatalError


def record(key: str, value: int) -> None:
    """Record ``key -> value`` in the job's Redis; a negative value is bad input."""
    if value < 0:
        raise FatalError(f"negative value for {key}")
    get_current_job().connection.hset("test:record", key, value)


def slow_record(key: str, value: int, seconds: float = 1.0) -> None:
    """Like ``record`` but takes ``seconds`` first (to be interrupted)."""
    import time
    time.sleep(seconds)
    record(key, value)


def write_edges(ctx, shard: int, start: int, count: int, pause: float = 0.0,
                batch: int = 50) -> None:
    """Chunk handler: ``count`` rows of ``user_has_pins`` on ``shard``, fenced, idempotent.

    Row i is (from_id = user 7 on shard, to_id = pin start+i, sequence = start+i).
    """
    import time

    from shardfarm.ledger import Outcome
    from sharding import fencing, ids
    from sharding.schema import shard_table
    q = shard_table(shard, "user_has_pins")
    owner = ids.encode(shard, "user", 7)
    for lo in range(start, start + count, batch):
        hi = min(lo + batch, start + count)
        rows = [(owner, ids.encode(shard, "pin", i), i) for i in range(lo, hi)]

        def tx(cur, rows=rows):
            fencing.check(cur, shard, ctx.token)
            cur.executemany(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s,%s,%s)"
                            " ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)", rows)
        ctx.router.run(shard, tx)
        ctx.check()
        time.sleep(pause)
    return Outcome(rows_read=count, rows_written=count)


def explode(ctx, fatal: bool) -> None:
    """Chunk handler that always fails (fatally or transiently)."""
    from shardfarm.errors import FatalError, RetryableError
    raise (FatalError if fatal else RetryableError)("boom on purpose")


def die_once(key: str, value: int, die: bool = False) -> None:
    """Like ``record``; an item with ``die`` SIGKILLs its own worker the first time it runs
    (remembered in Redis), the way an OOM kill or a lost machine would."""
    import os
    import signal
    conn = get_current_job().connection
    if die and conn.set(f"test:died:{key}", 1, nx=True):
        os.kill(os.getpid(), signal.SIGKILL)
    record(key, value)


def flaky_once(key: str, value: int) -> None:
    """Like ``record``, but the first run of each key fails with an unexpected error."""
    if get_current_job().connection.set(f"test:flaked:{key}", 1, nx=True):
        raise RuntimeError(f"first run of {key} fails")
    record(key, value)
