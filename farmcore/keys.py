"""Every Redis key shardfarm uses, built here and nowhere else.

rq's own keys (``rq:queue:…``, ``rq:job:…``, registries) are built by rq; these
are the farm's additions beside them.
"""

from __future__ import annotations

PREFIX = "farm"


def inflight(queue: str, bucket: int | None) -> str:
    """One of the small hashes of items queued or running on ``queue``: item ID -> the rq job
    that carries it (``None``: the pattern that matches them all).

    The dedup index: an item is a duplicate only while its entry names a job that exists;
    entries are removed when the item finishes or fails for good, so it holds only what is
    in flight."""
    return f"{PREFIX}:inflight:{queue}:" + ("*" if bucket is None else f"{bucket:04x}")


def items_queued(queue: str) -> str:
    """Counter of items waiting on ``queue`` (a job may carry many items)."""
    return f"{PREFIX}:items:{queue}"


def job_items(queue: str) -> str:
    """Hash of the jobs of ``queue`` whose items are counted in ``items_queued``: rq job ID ->
    how many items it carries. Written with the job, removed when its items are counted out
    (done, settled, or reaped when the job's data was lost); what housekeeping sweeps for jobs
    whose rq hash is gone or overwritten."""
    return f"{PREFIX}:jobitems:{queue}"


def lost_sweep(queue: str) -> str:
    """Where housekeeping's sweep of ``job_items`` resumes (an HSCAN cursor)."""
    return f"{PREFIX}:lostsweep:{queue}"


def lost_jobs(queue: str) -> str:
    """Sorted set of the jobs of ``queue`` found lost whose items are being looked for in the
    dedup index, a slice a round: job ID -> the ``lost_scan`` count at which a whole pass of
    the index since it was found is done (it is then counted out and recorded)."""
    return f"{PREFIX}:lostjobs:{queue}"


def lost_named(queue: str) -> str:
    """Hash of the jobs in ``lost_jobs``: job ID -> how many of its items were found in the
    dedup index (released and recorded) so far."""
    return f"{PREFIX}:lostnamed:{queue}"


def lost_scan(queue: str) -> str:
    """Counter of the dedup buckets of ``queue`` the lost-job scan has claimed (the next slice
    starts at this count modulo the number of buckets)."""
    return f"{PREFIX}:lostscan:{queue}"


def item_progress(job_id: str) -> str:
    """How many items of a multi-item job are already done (resume point after a crash)."""
    return f"{PREFIX}:progress:{job_id}"


def failed_items(queue: str) -> str:
    """Hash of failed items of ``queue``: item ID -> JSON with the reason."""
    return f"{PREFIX}:failed:{queue}"


def desired_workers(host: str | None = None) -> str:
    """Desired worker count, for every host (``None``) or one host."""
    return f"{PREFIX}:scale:{host or '*'}"


def supervisors() -> str:
    """Hash of live supervisors: ``host:pid`` -> JSON heartbeat."""
    return f"{PREFIX}:supervisors"


def job_timings(supervisor: str) -> str:
    """List of jobs ended by a supervisor's workers (queue, outcome, seconds), drained by that
    supervisor into its metrics (``farm workers --metrics-port``)."""
    return f"{PREFIX}:timings:{supervisor}"


def burst_outcomes(burst: str) -> str:
    """Hash of what the workers of one ``farm workers --burst`` ran that did not succeed:
    item or chunk ID (``job:<id>`` for a whole rq job) -> ``<chunk|item|job>:<failed|retrying>``;
    an entry goes when a later run of the same thing in the burst succeeds."""
    return f"{PREFIX}:burst:{burst}"


def throttle(run_id: str) -> str:
    """Why a run is throttled right now (expires by itself)."""
    return f"{PREFIX}:throttle:{run_id}"


def leader(name: str) -> str:
    """Leader lease of a singleton such as the nightly scheduler."""
    return f"{PREFIX}:leader:{name}"


def home_feed(user_id: int) -> str:
    """A user's home feed: list of pin IDs, newest first (readers ``LRANGE 0 49``)."""
    return f"home:{user_id}"


def home_feed_tmp(user_id: int) -> str:
    """Where a rebuilt home feed is written before it is renamed over ``home_feed`` (within
    the transaction that writes it: it never outlives that)."""
    return f"home:{user_id}:tmp"


FEED_GENERATION_BUCKET = 7  # low bits of a user ID: users per hash in feed_generations


def feeds_fence(run_id: str) -> str:
    """Hash of a feeds run's chunk fences: chunk ID -> the ledger fence of the chunk's newest
    owner, advanced by each owner before it reads; a feed swap under a lower fence is refused
    (expires some days after its last advance)."""
    return f"{PREFIX}:feedsfence:{run_id}"


def feeds_generation() -> str:
    """The last generation a feeds chunk attempt drew, before it read: Redis's clock in
    microseconds, or one more than the last drawn if that is higher (``loaders.feedswap``)."""
    return f"{PREFIX}:feedsgen"


def feed_generations(user_id: int) -> str:
    """Hash of the generations that last wrote the home feeds of 128 neighbouring users:
    ``feed_generation_field(user_id)`` -> generation (small: stored compactly by Redis)."""
    return f"{PREFIX}:feedgens:{user_id >> FEED_GENERATION_BUCKET}"


def feed_generation_field(user_id: int) -> int:
    """The field of ``user_id`` in its ``feed_generations`` hash."""
    return user_id & ((1 << FEED_GENERATION_BUCKET) - 1)
