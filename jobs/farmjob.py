"""rq's ``Job`` with every name it reads from Redis behind the farm's policy.

rq imports code by name in four places: the job's function and its success,
failure and stopped callbacks (the last also from registry cleanup, for jobs
of dead workers), and it sends HTTP webhooks named in the job. ``FarmJob``,
used by every farm queue, worker and registry, closes all of them: the
function is the farm's own envelope or nothing, callbacks are never imported
and webhooks never sent. A job that names any of them is refused before
anything is imported (``job_refusal``) and settled into ``farm failed``.

Whatever is written into a job's hash must not crash the process that reads it: a hash
rq cannot restore (a bad status, date, number, no payload) is restored from its readable
fields and marked ``unreadable`` (kept in the hash as ``farm_unreadable`` by every later
save), so every path that meets it (a worker, rq's registry cleanup, the scheduler step,
settling) refuses it like a foreign job instead of raising. A job key that is not a hash
at all holds nothing to run or record: it is taken for no job (a warning), as rq takes a
missing one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import decode_redis_hash

from jobs.policy import ENTRY_POINT, ForbiddenJobError, JobPolicy
from shardfarm.bounds import wrong_type

log = logging.getLogger(__name__)
MAX_REASON = 300
UNREADABLE_FIELD = "farm_unreadable"


def job_refusal(job: Job, policy: JobPolicy) -> str | None:
    """Why ``job`` may not run (``None``: it is a well-formed farm batch of allowed code)."""
    if getattr(job, "unreadable", None):
        return job.unreadable
    try:
        name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except DeserializationError:
        return "payload is not JSON (a pickle?): refused unread"
    if name != ENTRY_POINT:
        return (f"rq function {str(name)[:120]!r} is not the farm's entry point "
                f"{ENTRY_POINT}: enqueue functions with 'farm enqueue' or jobs.enqueue_many")
    if instance is not None or args:
        return "a farm job takes keyword arguments only, and no instance"
    # rq's public accessors of callbacks (``success_callback``…) import them; only these
    # private names read what a job names without importing it, and rq has no public
    # list of dependency IDs (``dependency`` fetches the job). Tested with rq 3.0.
    names = (job._success_callback_name, job._failure_callback_name, job._stopped_callback_name)
    if any(names) or job.webhooks or job._dependency_ids:
        return "names a callback, webhook or dependency (farm jobs have none)"
    if not isinstance(kwargs, dict) or set(kwargs) != {"function", "items"} \
            or not isinstance(kwargs["items"], list) or not all(map(_item_ok, kwargs["items"])):
        return "malformed farm batch (expected function and items [id, kwargs, attempts?])"
    return policy.item_refusal(kwargs["function"])


def _item_ok(item: object) -> bool:
    return (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], str)
            and isinstance(item[1], dict)
            and (len(item) == 2 or (isinstance(item[2], int) and not isinstance(item[2], bool))))


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class FarmJob(Job):
    """A Job that runs only the farm's entry point, and never imports callbacks."""

    unreadable: str | None = None  # why rq could not restore the job's hash (then refused)

    def restore(self, raw_data: dict) -> None:
        """rq's restore; a hash it cannot restore is restored from its readable fields and
        marked ``unreadable`` instead of raising: no retries left, and counted as started
        (rq's cleanup of a dead worker's jobs then fails it, never drops it)."""
        obj = decode_redis_hash(raw_data)
        self.unreadable = None
        if not self._restores(obj):  # probed outside the except: no chained tracebacks
            self._restore_readable(obj)
        if marker := obj.get(UNREADABLE_FIELD):  # the first reason found, kept by a save
            self.unreadable = _text(marker)[:MAX_REASON]

    def refresh(self) -> None:
        """rq's refresh; a job key that is not a hash is ``NoSuchJobError``, not a crash."""
        try:
            super().refresh()
        except redis.ResponseError as exc:
            if not wrong_type(exc):
                raise
            log.warning("%s is not an rq job hash: taken for no job", self.key)
            raise NoSuchJobError(f"{self.key} is not a job hash") from None

    @classmethod
    def fetch_many(cls, job_ids: Iterable[str], connection: redis.Redis,
                   serializer: Any = None) -> list[FarmJob | None]:
        """rq's fetch_many (one round trip); if a key is not a hash, one by one, that one
        ``None`` like a missing job."""
        job_ids = list(job_ids)
        try:
            return super().fetch_many(job_ids, connection=connection, serializer=serializer)
        except redis.ResponseError:
            return [cls._fetch_or_none(i, connection, serializer) for i in job_ids]

    @classmethod
    def _fetch_or_none(cls, job_id: str, connection: redis.Redis,
                       serializer: Any) -> FarmJob | None:
        try:
            return cls.fetch(job_id, connection=connection, serializer=serializer)
        except NoSuchJobError:
            return None

    def _restore_readable(self, obj: dict) -> None:
        base = {"data": obj.get("data", b"")}
        bad = [k for k in obj if k != "data" and not self._restores({**base, k: obj[k]})]
        if not self._restores({k: v for k, v in obj.items() if k not in bad} | base):
            bad = [k for k in obj if k != "data"]
            super().restore(base)
        what = [f"{k}={_text(obj[k])[:40]!r}" for k in bad]
        what += ["no payload"] * ("data" not in obj)
        self.unreadable = (f"rq's record of the job is unreadable ({', '.join(what)}): "
                           "refused unread")[:MAX_REASON]
        self.retries_left, self._status = 0, JobStatus.STARTED

    def _restores(self, obj: dict) -> bool:
        try:
            super().restore(obj)
        except Exception:  # noqa: BLE001 - whatever anyone wrote into the hash
            return False
        return True

    def to_dict(self, include_meta: bool = True, include_result: bool = True) -> dict:
        """rq's fields, plus the mark of an unreadable job (a re-saved one stays refused)."""
        obj = super().to_dict(include_meta=include_meta, include_result=include_result)
        if self.unreadable:
            obj[UNREADABLE_FIELD] = self.unreadable
        return obj

    @property
    def func(self) -> Callable:
        """The farm's envelope, if this job passes the policy; else ``ForbiddenJobError``."""
        from jobs import items, runtime
        refusal = job_refusal(self, runtime.get().policy)
        if refusal:
            raise ForbiddenJobError(refusal[:MAX_REASON])
        return items.run_items

    @property
    def success_callback(self) -> None:
        """Never imported: a job naming a callback is refused."""
        return None

    @property
    def failure_callback(self) -> None:
        """Never imported (rq's registry cleanup reads it for jobs of dead workers)."""
        return None

    @property
    def stopped_callback(self) -> None:
        """Never imported."""
        return None

    def send_webhooks(self, status: Any, *, exc_string: str | None = None) -> None:
        """Never sent: a job naming a webhook is refused."""
        return None
