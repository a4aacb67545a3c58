"""Where the farm stands: runs and chunk kinds from the ledger, workers and queues from Redis.

Cost does not grow with the number of queued jobs: queue depths are ``LLEN``s
and counters, never scans of job keys.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import defaultdict

import redis
from rq import Queue, Worker
from rq.registry import FailedJobRegistry, ScheduledJobRegistry
from rq.serializers import JSONSerializer
from rq.worker_registration import get_keys

from farmcore import keys, ledger_size
from farmcore.identity import farm_id
from farmcore.progress import read_progress
from jobs.runtime import Runtime

SUPERVISOR_FRESH = 15.0  # seconds since a supervisor's last heartbeat (it beats every 0.5 s)


def worker_name(host: str | None = None) -> str:
    """``host:pid:token``: which machine a worker runs on is in its name, not only in rq's
    hash of it (``host_of``)."""
    return f"{host or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def host_of(worker: Worker) -> str:
    """The host a worker runs on: rq's record of it, else the farm's worker name."""
    parts = worker.name.split(":")
    named = parts[0] if len(parts) == 3 and parts[1].isdigit() else None
    return worker.hostname or named or worker.ip_address or "unknown host"


def kind_view(k: dict) -> dict:
    """One chunk kind's progress with its rate and ETA (ETA only once 1% is done)."""
    elapsed = (k["now"] - k["first_start"]).total_seconds() if k["first_start"] else 0.0
    if k["done"] + k["failed"] == k["total"] and k["last_finish"] and k["first_start"]:
        elapsed = (k["last_finish"] - k["first_start"]).total_seconds()
    rate = k["rows_written"] / elapsed if elapsed > 0 else 0.0
    frac = k["done"] / k["total"] if k["total"] else 1.0
    eta = elapsed * (1 - frac) / frac if frac >= 0.01 and frac < 1 else None
    return {"kind": k["kind"], "done": k["done"], "total": k["total"], "running": k["running"],
            "failed": k["failed"], "rows_read": k["rows_read"], "rows_written": k["rows_written"],
            "quarantined": k["rows_quarantined"], "rows_per_s": round(rate, 1),
            "eta_s": None if eta is None else round(eta, 1)}


def run_view(rt: Runtime, run_id: str) -> dict:
    """One run: status, pause/throttle state and per-kind progress."""
    run = rt.ledger.run(run_id)
    return {"run_id": run_id, "kind": run["kind"], "status": run["status"],
            "paused": run["paused"], "queue": run["queue"],
            "throttled": throttle_text(_read(rt.redis.get, keys.throttle(run_id))),
            "created_at": run["created_at"].isoformat(timespec="seconds"),
            "kinds": [kind_view(k) for k in rt.ledger.progress(run_id)],
            "progress": read_progress(rt.ledger, run_id).as_dict()}


def _read(command, key: str, default: object = None) -> object:
    """``command(key)``, or ``default`` when the key holds another type (whatever was written
    into Redis: a status view shows what it can, never dies on it)."""
    try:
        return command(key)
    except redis.ResponseError:
        return default


def throttle_text(raw: bytes | None) -> str | None:
    """Why a run is throttled, as ``jobs.throttle`` wrote it (bytes that are not UTF-8, or a
    long text, written by anyone: shown replaced and cut)."""
    return raw.decode(errors="replace")[:200] if raw else None


def read_count(conn: redis.Redis, key: str) -> int:
    """A counter such as ``keys.items_queued``; 0 when it holds anything but an integer
    (the next script that changes it starts it again from 0)."""
    raw = _read(conn.get, key) or b"0"
    text = raw.strip().removeprefix(b"-")
    return int(raw) if text.isdigit() and len(text) <= 15 else 0


def read_workers(conn: redis.Redis) -> tuple[list[Worker], int]:
    """rq's registry of workers, each entry read on its own: returns the workers and how many
    entries could not be read (whatever was written into Redis: skipped, never an error)."""
    found: list[Worker] = []
    unreadable = 0
    for key in sorted(conn.smembers(Worker.redis_workers_keys)):
        try:
            worker = Worker.find_by_key(key.decode(), connection=conn, serializer=JSONSerializer)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception:  # noqa: BLE001 - a forged entry is counted, not a crash
            unreadable += 1
            continue
        if worker is not None:  # None: its hash expired (rq drops the entry)
            found.append(worker)
    return found, unreadable


def workers_view(rt: Runtime, workers: list[Worker] | None = None) -> dict:
    """Workers alive per host (rq's worker registry, or ``workers`` read from it),
    supervisors' desired counts, and ``other_farm`` for a host whose supervisor serves
    another control database (``farmcore.identity``)."""
    per_host: dict[str, dict] = defaultdict(lambda: {"workers": 0, "busy": 0, "desired": None})
    for w in read_workers(rt.redis)[0] if workers is None else workers:
        h = per_host[host_of(w)]
        h["workers"] += 1
        h["busy"] += w.get_state() == "busy"
    ours = farm_id(rt.ledger.pool)
    for doc in read_supervisors(rt.redis):
        h = per_host[doc["host"]]
        h["desired"] = (h["desired"] or 0) + doc["desired"]
        if serves_another_farm(doc, ours):
            h["other_farm"] = True
    return dict(per_host)


def read_supervisors(conn: redis.Redis) -> list[dict]:
    """The supervisors' heartbeats (``workers.supervisor``) of the last ``SUPERVISOR_FRESH``
    seconds; stale ones are deleted, and entries that are not a supervisor's (whatever was
    written into Redis) skipped, never an error."""
    out, now = [], time.time()
    for me, raw in _read(conn.hgetall, keys.supervisors(), {}).items():
        doc = _supervisor(raw)
        if doc is None:
            continue
        if now - doc["at"] > SUPERVISOR_FRESH:
            conn.hdel(keys.supervisors(), me)
            continue
        out.append(doc)
    return out


def serves_another_farm(doc: dict, ours: str | None) -> bool:
    """Whether a supervisor's heartbeat says its workers serve another control database than
    the one whose farm ID is ``ours`` (either unknown: no)."""
    return bool(ours) and doc.get("farm_id") not in (None, ours)


def _supervisor(raw: bytes) -> dict | None:
    """A heartbeat as the supervisor writes it, else ``None``."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    fields = {"host": str, "at": (int, float), "desired": int}
    if not isinstance(doc, dict) or not all(
            isinstance(doc.get(k), t) and not isinstance(doc.get(k), bool)
            for k, t in fields.items()):
        return None
    return doc


def queues_view(rt: Runtime) -> dict:
    """Per queue: rq jobs waiting, items they carry, scheduled and failed jobs."""
    out = {}
    for q in Queue.all(connection=rt.redis, serializer=JSONSerializer):
        out[q.name] = {"jobs": q.count, "items": read_count(rt.redis, keys.items_queued(q.name)),
                       "scheduled": ScheduledJobRegistry(queue=q).count,
                       "failed_jobs": FailedJobRegistry(queue=q).count,
                       "failed_items": _read(rt.redis.hlen, keys.failed_items(q.name), 0)}
    return out


def farm_view(rt: Runtime, run_id: str | None = None, limit: int = 5) -> dict:
    """Everything ``farm status`` shows."""
    run_ids = [run_id] if run_id else rt.ledger.runs(limit=limit)
    workers, unreadable = read_workers(rt.redis)
    view = {"runs": [run_view(rt, r) for r in run_ids], "workers": workers_view(rt, workers),
            "queues": queues_view(rt), "ledger": ledger_size.size(rt.ledger.pool)}
    if unreadable:
        view["unreadable_workers"] = unreadable
    return view


def serving(conn: redis.Redis, queue: str, most: int = 200) -> int:
    """How many live workers take jobs from ``queue`` (rq's registry of the queue's workers,
    the first ``most`` of it; a dead worker's entry, whose hash expired, is not counted)."""
    q = Queue(queue, connection=conn, serializer=JSONSerializer)
    names = sorted(get_keys(queue=q, connection=conn))[:most]
    return int(conn.exists(*names)) if names else 0


def queue_names(conn: redis.Redis) -> list[str]:
    """Every queue Redis knows of (rq's registry of queues): those a job was ever queued on."""
    return sorted(q.name for q in Queue.all(connection=conn, serializer=JSONSerializer))


def failed_items(rt: Runtime) -> list[dict]:
    """Items (and foreign jobs) that stopped trying, in the shape ``farm failed`` prints."""
    out = []
    for q in Queue.all(connection=rt.redis, serializer=JSONSerializer):
        records = _read(rt.redis.hgetall, keys.failed_items(q.name), {})
        for item_id, raw in sorted(records.items()):
            name = item_id.decode(errors="replace")
            what = "job" if name.startswith("job:") else "item"
            out.append({"where": f"queue {q.name} {what} {name.removeprefix('job:')}",
                        **failure_view(raw)})
    return out


def failure_view(raw: bytes) -> dict:
    """A ``farm failed`` record (``jobs.accounting.failure``) as ``farm failed`` shows it; one
    that the farm did not write (whatever was written into Redis) says so."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not {"function", "attempts", "error", "kwargs"} <= set(doc):
        text = raw.decode(errors="replace")[:80]
        return {"kind": "?", "attempts": 0, "args": None,
                "last_error": f"unreadable failure record (not the farm's): {text!r}"}
    return {"kind": str(doc["function"])[:200], "attempts": doc["attempts"],
            "last_error": str(doc["error"])[:1000], "args": doc["kwargs"]}
