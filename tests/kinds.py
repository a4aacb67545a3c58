"""Functions the tests enqueue (importable by real worker processes)."""

from rq import get_current_job

from shardfarm.errors import FatalError


def record(key: str, value: int) -> None:
    """Record ``key -> value`` in the job's Redis; a negative value is bad input."""
    if value < 0:
        raise FatalError(f"negative value for {key}")
    get_current_job().connection.hset("test:record", key, value)


def ordered_record(key: str, value: int) -> None:
    """Like ``record``, and ``key`` appended to ``test:order`` (the order items ran in)."""
    record(key, value)
    get_current_job().connection.rpush("test:order", key)


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

    from farmcore.ledger import Outcome
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


def sleepy(ctx, seconds: float) -> None:
    """Chunk handler that sleeps ``seconds`` without looking at the clock (rq's own timeout is
    what stops it), then records its attempt in Redis."""
    import time

    from farmcore.ledger import Outcome
    time.sleep(seconds)
    ctx.redis.rpush(f"test:sleepy:{ctx.run_id}", ctx.lease.attempts)
    return Outcome(rows_written=1)


def mod_ports(ctx, buckets: list[int], key: str) -> None:
    """Chunk handler: for each bucket, ask its mod server (through the chunk's router) for its
    port and record it in Redis list ``key``; half way, say ``<key>:half`` and wait for
    ``<key>:go`` (a barrier the test releases after changing the map)."""
    from farmcore.ledger import Outcome
    half = len(buckets) // 2
    for i, bucket in enumerate(buckets):
        if i == half:
            ctx.redis.set(f"{key}:half", 1)
            if not ctx.redis.blpop([f"{key}:go"], timeout=60):
                raise RuntimeError("the test never released the barrier")
        port = ctx.router.run_mod(bucket, lambda cur: (cur.execute("SELECT @@port"),
                                                       cur.fetchone()[0])[1])
        ctx.redis.rpush(key, port)
    return Outcome(rows_read=len(buckets))


def export_frozen(ctx, table: str, freeze_once: str, part_size: int = 0, **shards):
    """``exporters.export.export_chunk``, but the first attempt to get there (the one that
    creates the file ``freeze_once``, writing its PID) freezes its whole process with
    SIGSTOP at the start of a part's ``publish()``: after the part's bytes are written
    (and, with ``part_size``, uploaded as multipart parts of that size), before the
    rename or the upload's completion and anything those do first."""
    import os
    import signal
    import threading

    from exporters import destinations, s3
    from exporters import export as exporter

    def freezing(publish):
        def wrapped(self):
            key = str(getattr(self, "target", getattr(self, "key", "")))
            if "/part-" in key:
                try:
                    fd = os.open(freeze_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return publish(self)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                # to this thread: a process-directed SIGSTOP is taken by the main thread,
                # and a publishing thread of the pool ran on past it into its fence and
                # upload until the main thread got to stopping the process
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            return publish(self)
        wrapped.frozen = True
        return wrapped

    for cls in (destinations.FileWriter, destinations.S3Writer):
        if not getattr(cls.publish, "frozen", False):
            cls.publish = freezing(cls.publish)
    if part_size:
        s3.MIN_PART = s3.PART_SIZE = part_size
        init = destinations.S3Writer.__init__
        init.__defaults__ = (part_size, *init.__defaults__[1:])
    return exporter.export_chunk(ctx, table, **shards)


def held_edges(ctx, shard: int, start: int, count: int, hold: str, gate: str):
    """Chunk handler for the network tests: ``count`` rows of ``user_has_pins`` on ``shard``
    in two fenced halves, each row's sequence tagged ``fence * 10**6 + i`` (so the rows
    say which attempt wrote them last).

    The first attempt to reach its hold point (``middle``: between the halves; ``end``:
    after both, before the chunk is marked done) creates ``{gate}.held`` (holding
    ``pid fence``) and waits for the file ``{gate}.go``; its late step (the second half's
    write, or marking the chunk done in the ledger) then records ``accepted`` or
    ``refused: …`` in ``{gate}.late``. Later attempts pass straight through.
    """
    from farmcore.ledger import Outcome
    out = Outcome(rows_read=count, rows_written=count)
    half = count // 2
    _tagged_edges(ctx, shard, start, half)

    def second_half():
        _tagged_edges(ctx, shard, start + half, count - half)
    if hold == "middle" and _hold(ctx, gate):
        _late(gate, second_half)
    else:
        second_half()
    if hold == "end" and _hold(ctx, gate):
        _late(gate, lambda: ctx.ledger.finish(ctx.lease, out))
    return out


def _tagged_edges(ctx, shard: int, start: int, count: int) -> None:
    """One fenced transaction of rows ``start … start+count-1`` tagged with the fence."""
    from sharding import fencing, ids
    from sharding.schema import shard_table
    owner = ids.encode(shard, "user", 7)
    rows = [(owner, ids.encode(shard, "pin", i), ctx.lease.fence * 10**6 + i)
            for i in range(start, start + count)]

    def tx(cur):
        fencing.check(cur, shard, ctx.token)
        cur.executemany(f"INSERT INTO {shard_table(shard, 'user_has_pins')} (from_id, to_id, "
                        "sequence) VALUES (%s,%s,%s) ON DUPLICATE KEY UPDATE "
                        "sequence = VALUES(sequence)", rows)
    ctx.router.run(shard, tx)


def _hold(ctx, gate: str) -> bool:
    """Whether this attempt is the one to hold (then it has waited for ``{gate}.go``)."""
    import os
    import time
    try:
        fd = os.open(f"{gate}.held", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {ctx.lease.fence}".encode())
    os.close(fd)
    deadline = time.monotonic() + 600
    while not os.path.exists(f"{gate}.go"):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.05)
    return True


def _late(gate: str, step) -> None:
    """Run the held attempt's late ``step``; record whether the fence let it through (the
    file appears with its text: written under another name, then renamed)."""
    from shardfarm.errors import FencedError
    try:
        step()
    except FencedError as exc:
        _publish(f"{gate}.late", f"refused: {exc}")
        raise
    _publish(f"{gate}.late", "accepted")


def _publish(path: str, text: str) -> None:
    """``text`` in ``path``, which a reader never sees empty."""
    import os
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)


def map_probe(ctx, shard: int, key: str, pin: int) -> None:
    """Chunk handler: note the shard map version this attempt routes with (``KEY:started``),
    wait until ``KEY:go`` is set, then write one fenced row on ``shard`` (``KEY:wrote``)."""
    import time

    from sharding import fencing, ids
    from sharding.schema import shard_table
    version = ctx.router.shardmap.version
    ctx.redis.rpush(f"{key}:started", version)
    while not ctx.redis.get(f"{key}:go"):
        ctx.check()
        time.sleep(0.05)
    q = shard_table(shard, "user_has_pins")

    def tx(cur):
        fencing.check(cur, shard, ctx.token)
        cur.execute(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, 1) ON "
                    "DUPLICATE KEY UPDATE sequence = sequence + 1",
                    (ids.encode(shard, "user", 9), ids.encode(shard, "pin", pin)))
    ctx.router.run(shard, tx)
    ctx.redis.rpush(f"{key}:wrote", version)


def feeds_frozen(ctx, freeze_once: str, **args):
    """``loaders.feeds.rebuild_chunk``, but the first attempt to get there (the one that
    creates the file ``freeze_once``, writing its PID) freezes its whole process with
    SIGSTOP as it calls ``swap_feeds``: after its batch was read and its lease checked,
    before anything of the swap is sent to Redis."""
    import os
    import signal

    from loaders import feeds

    def freezing(swap):
        def wrapped(*a, **kw):
            try:
                fd = os.open(freeze_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return swap(*a, **kw)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGSTOP)  # the lease renewer's thread stops too
            return swap(*a, **kw)
        wrapped.frozen = True
        return wrapped

    if not getattr(feeds.swap_feeds, "frozen", False):
        feeds.swap_feeds = freezing(feeds.swap_feeds)
    return feeds.rebuild_chunk(ctx, **args)


def loses_its_job(key: str, value: int) -> None:
    """Like ``record``; the first run of key ``k0`` first deletes its own job's rq hash and
    runs housekeeping's lost-job sweep until the job is reaped, the way an eviction or a
    stray DEL seen by housekeeping would, while the worker goes on with the batch."""
    from farmcore import keys
    from jobs import accounting, lost
    job = get_current_job()
    conn = job.connection
    if key == "k0" and conn.set(f"test:lost:{key}", 1, nx=True):
        conn.delete(accounting.JOB_PREFIX + job.id)
        while conn.hexists(keys.job_items(job.origin), job.id):
            lost.sweep(conn, job.origin)
    record(key, value)


def gated(gate: str) -> None:
    """Add a line to ``{gate}.held`` (one a run), then wait for ``{gate}.go`` (written by the
    test) and return, touching nothing else: the test decides when the job ends."""
    import os
    import time
    with open(f"{gate}.held", "a") as f:
        f.write("run\n")
    deadline = time.monotonic() + 600
    while not os.path.exists(f"{gate}.go"):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.05)
