"""``farm demo --clean``: delete what the demo makes, and nothing else.

- the shard and mod-bucket databases of the demo's shard map, and the legacy and control
  databases (its settings);
- the files of the exports the demo ran (never the rest of the destination);
- in Redis, only the farm's keys: ``farm:*`` (``farmcore.keys.PREFIX``), the rq queues the
  farm used (every ``runs.queue`` of the control database, and the default queue) with
  their jobs, registries and workers, and the home feeds of users whose shard is in the
  demo's map. Another application's rq queues and jobs, and any other key, stay; rq's
  group-maintenance lock (``rq:clean_groups``, every app's) goes only when no rq worker is
  left registered, since then nobody holds it (it would expire by itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress

import redis
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.group import Group
from rq.job import Job
from rq.results import Result
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from demo.guard import control_runs
from exporters import export as exporter
from exporters.destinations import FileDestination, open_destination
from farmcore import keys
from jobs.runs import DEFAULT_QUEUE
from jobs.runtime import Runtime
from shardfarm.errors import InvalidIdError
from shardfarm.mysql.db import drop_database
from shardfarm.mysql.dsn import Host
from sharding import ids
from sharding.schema import mod_db, shard_db

_HOME = keys.home_feed(0)[:-1]  # "home:"


def clean_everything(rt: Runtime) -> dict:
    """Drop the demo's databases, delete its exports and the farm's Redis keys; counts."""
    runs = control_runs(rt) or []  # read before the control database goes
    exported = remove_demo_exports(runs)
    dropped = drop_demo_databases(rt)
    conn = rt.settings.redis()
    try:
        queues = farm_queues(runs)
        deleted = (farm_keys(conn) + sum(rq_queue_keys(conn, q) for q in queues)
                   + rq_worker_keys(conn, set(queues)) + home_feeds(conn, rt)
                   + orphan_rq_locks(conn, set(queues)))
    finally:
        conn.close()
    return {"dropped_databases": dropped, "redis_keys_deleted": deleted,
            "export_files_deleted": exported}


def farm_queues(runs: list[dict]) -> list[str]:
    """The rq queues the farm used: every run's, and the default queue."""
    return sorted({DEFAULT_QUEUE, *(r["queue"] for r in runs if r["queue"])})


def drop_demo_databases(rt: Runtime) -> int:
    """Drop every shard and mod database of the map, then the legacy and control databases."""
    m = rt.router.shardmap
    dropped = 0
    for shard in m.shards():
        dropped += _drop(rt, m.master(shard), shard_db(shard))
    for b in range(m.buckets):
        dropped += _drop(rt, m.mod_master(b), mod_db(b))
    for dsn in (rt.settings.legacy_dsn, rt.settings.control_dsn):
        drop_database(dsn)
    return dropped + 2


def _drop(rt: Runtime, host: Host, db: str) -> int:
    """Drop database ``db`` on ``host`` if it exists; counts it."""
    with rt.router.connection(host) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
    return 1


def remove_demo_exports(runs: list[dict], dry: bool = False) -> int:
    """Delete (``dry``: count) the files of every export the demo ran (never the rest of the
    destination)."""
    files: dict[str, set[str]] = {}
    for run in runs:
        p = run["params"]
        if run["kind"] == "export" and p.get("demo"):
            dest = open_destination(p["dest"])
            files.setdefault(p["dest"], set()).update(
                key for table in p["kinds"]
                for key in dest.list(exporter.folder_of(table, p["date"])))
    if not dry:
        for url, found in files.items():
            dest = open_destination(url)
            for key in found:
                dest.delete(key)
            if isinstance(dest, FileDestination):
                _prune_empty(dest.root)
    return sum(len(found) for found in files.values())


def _prune_empty(root: str | os.PathLike) -> None:
    """Remove empty directories under ``root`` (bottom up), and ``root`` if it ends empty."""
    for path, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        with suppress(OSError):  # not empty
            os.rmdir(path)


def _delete_matching(conn: redis.Redis, pattern: str,
                     keep: Callable[[str], bool] = lambda key: False, dry: bool = False) -> int:
    """Delete the keys matching ``pattern`` (SCAN), except those ``keep`` says to leave;
    ``dry``: only count them."""
    n = 0
    for key in conn.scan_iter(match=pattern, count=1000):
        if not keep(key.decode()):
            n += 1 if dry else conn.delete(key)
    return n


def farm_keys(conn: redis.Redis, dry: bool = False) -> int:
    """Delete (``dry``: count) every key of the farm's own namespace (``farm:*``)."""
    return _delete_matching(conn, f"{keys.PREFIX}:*", dry=dry)


def rq_queue_keys(conn: redis.Redis, name: str) -> int:
    """Delete one rq queue: its waiting jobs, every registry and the jobs they hold."""
    q = Queue(name, connection=conn, serializer=JSONSerializer)
    n = 0
    for registry in _registries(q):
        for job_id in registry.get_job_ids(cleanup=False):
            n += _delete_job(conn, job_id)
        n += conn.delete(registry.key)
    n += q.count
    q.delete(delete_jobs=True)
    n += conn.delete(q.intermediate_queue_key, q.registry_cleaning_key,
                     RQScheduler.get_locking_key(name))
    n += _delete_matching(conn, f"{q.intermediate_queue_key}:first_seen:*")  # rq's cleanup marks
    return n


def _delete_job(conn: redis.Redis, job_id: str) -> int:
    """Delete one job and what rq keeps beside it (results, executions, dependents)."""
    try:
        Job.fetch(job_id, connection=conn, serializer=JSONSerializer).delete()
        return 1
    except (NoSuchJobError, ValueError, TypeError, AttributeError):
        key = Job.key_for(job_id)  # not readable as a job: delete its keys as they are
        return conn.delete(key, f"{key}:dependents", f"{key}:dependencies",
                           Result.get_key(job_id))


def queue_jobs(conn: redis.Redis, name: str) -> int:
    """Jobs of one rq queue, waiting or in any registry (what ``rq_queue_keys`` deletes)."""
    q = Queue(name, connection=conn, serializer=JSONSerializer)
    return q.count + sum(r.get_job_count(cleanup=False)  # counting changes nothing
                         for r in _registries(q))


def _registries(q: Queue) -> tuple:
    """Every job registry rq keeps for queue ``q``."""
    return (q.started_job_registry, q.finished_job_registry, q.failed_job_registry,
            q.deferred_job_registry, q.scheduled_job_registry, q.canceled_job_registry,
            q.ready_job_registry)


def rq_worker_keys(conn: redis.Redis, queues: set[str], dry: bool = False) -> int:
    """Delete (``dry``: count) the registrations of rq workers that listen only to the
    farm's queues."""
    n = 0
    prefix = Worker.redis_worker_namespace_prefix
    for key in conn.scan_iter(match=prefix + "*", count=1000):
        listens = _listens(conn, key)
        if not _only(listens, queues):
            continue
        n += 1
        if not dry:
            for q in listens:
                conn.srem(WORKERS_BY_QUEUE_KEY % q, key)
            conn.delete(key)
            conn.srem(REDIS_WORKER_KEYS, key)
    return n


def orphan_rq_locks(conn: redis.Redis, queues: set[str], dry: bool = False) -> int:
    """Delete (``dry``: count) rq's group-maintenance lock when every rq worker registered
    listens only to the farm's ``queues`` (the clean removes them): no other application's
    worker can then hold it, and it would only expire by itself."""
    prefix = Worker.redis_worker_namespace_prefix
    if any(not _only(_listens(conn, key), queues)
           for key in conn.scan_iter(match=prefix + "*", count=1000)):
        return 0
    lock = Group.REDIS_GROUP_CLEANING_KEY
    return int(bool(conn.exists(lock))) if dry else conn.delete(lock)


def _listens(conn: redis.Redis, key: bytes) -> set[str]:
    """The queues the rq worker registered at ``key`` listens to."""
    return {q for q in (conn.hget(key, "queues") or b"").decode().split(",") if q}


def _only(listens: set[str], queues: set[str]) -> bool:
    """Whether a worker listening to ``listens`` listens to some queues, all in ``queues``."""
    return bool(listens) and listens <= queues


def home_feeds(conn: redis.Redis, rt: Runtime, dry: bool = False) -> int:
    """Delete (``dry``: count) the home feeds (and half-built ones) of users whose shard is
    in the map."""
    shards = set(rt.router.shardmap.shards())

    def not_ours(key: str) -> bool:
        """Whether ``key`` is not the home feed of a user of the map."""
        user = key[len(_HOME):].split(":", 1)[0]
        try:
            decoded = ids.decode(int(user))
        except (ValueError, InvalidIdError):
            return True
        return decoded.type_name != "user" or decoded.shard not in shards

    return _delete_matching(conn, _HOME + "*", keep=not_ours, dry=dry)
