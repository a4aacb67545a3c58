"""``farm cron``: the nightly export fires once per slot, with one leader among many
schedulers, catches up missed nights, and remembers what fired in the control database."""

import datetime as dt
import json
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from exporters import export as exporter
from jobs.runtime import Runtime
from shardfarm.errors import ConfigError, TransientDatabaseError, UsageError
from tests.conftest import ROOT, run_farm
from tests.farmkit import start_workers, stop, until
from workers import cron as scheduler

NOW = dt.datetime(2026, 11, 22, 3, 0, 30)  # just after tonight's 03:00 UTC slot


class Clock:
    """A settable clock for schedulers under test."""

    def __init__(self, now: dt.datetime) -> None:
        self.t = now

    def __call__(self) -> dt.datetime:
        return self.t


@pytest.fixture
def rt(settings, ledger, router, tmp_path):
    """A runtime whose exports go to a temp directory; the test Redis is flushed after."""
    r = Runtime(settings.with_(export_url=f"file://{tmp_path}/exports"))
    yield r
    r.redis.flushdb()
    r.close()


def _scheduler(rt: Runtime, name: str, clock: Clock, **kw) -> scheduler.Scheduler:
    return scheduler.Scheduler(rt, name=name, now=clock, export_args={"tables": ["users"]}, **kw)


def _runs_of(rt: Runtime, name: str) -> list[tuple]:
    with rt.ledger.pool.connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, kind, params FROM runs WHERE run_id LIKE %s ORDER BY run_id",
                    (f"cron-{name}-%",))
        return [(r, k, json.loads(p)) for r, k, p in cur.fetchall()]


# -- the schedule itself -----------------------------------------------------------------
def test_slots_between_catches_up_oldest_first_and_bounded():
    after = dt.datetime(2026, 11, 19, 3, 0)
    assert scheduler.slots_between("0 3 * * *", after, NOW) == [
        dt.datetime(2026, 11, d, 3, 0) for d in (20, 21, 22)]
    assert scheduler.slots_between("0 3 * * *", None, NOW) == [dt.datetime(2026, 11, 22, 3, 0)]
    assert scheduler.slots_between("0 3 * * *", NOW, NOW) == []
    long_ago = dt.datetime(2026, 1, 1)
    assert scheduler.slots_between("0 3 * * *", long_ago, NOW, limit=7) == [
        dt.datetime(2026, 11, d, 3, 0) for d in range(16, 23)]
    exactly = dt.datetime(2026, 11, 22, 3, 0)  # a slot is due at its own minute
    assert scheduler.slots_between("0 3 * * *", None, exactly) == [exactly]


@pytest.mark.parametrize("expr", ["0 3 * *", "61 3 * * *", "every night", "0 3 * * * *",
                                  "0 3 31 2 *", "0 3 30 2 *", "0 0 31 4,6 *"])
def test_bad_expression_is_one_clear_line(expr, farm_env):
    with pytest.raises(UsageError, match="bad --at"):
        scheduler.check_expression(expr)
    out = run_farm(farm_env, "cron", "--at", expr, "--once")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "bad --at" in out.stderr


@pytest.mark.parametrize("name", ["", "a b", "x" * 21, "nächte"])
def test_a_bad_name_is_a_usage_error(name, farm_env):
    """``--name`` is a flag: a bad one exits 2 (it was 1, as a configuration error)."""
    out = run_farm(farm_env, "cron", "--name", name, "--once")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stderr.splitlines() == [f"farm: error: bad --name {name!r} (letters, digits, "
                                       "'-'; 20 at most)"]


def test_run_ids_are_one_per_slot():
    slot = dt.datetime(2026, 11, 22, 3, 0)
    assert scheduler.run_id_for("export", slot) == "cron-export-20261122T0300Z"


# -- leadership, once per slot, catch-up --------------------------------------------------
def test_two_schedulers_fire_once_per_night(rt):
    clock = Clock(NOW)
    a = _scheduler(rt, "t-two", clock, owner="a")
    b = _scheduler(rt, "t-two", clock, owner="b")
    fired_a, fired_b = a.tick(), b.tick()
    assert [f["date"] for f in fired_a] == ["2026-11-21"] and fired_b == []
    assert a.tick() == [] and b.tick() == []  # the same night again: nothing
    runs = _runs_of(rt, "t-two")
    assert [(r, k) for r, k, _ in runs] == [("cron-t-two-20261122T0300Z", "export")]
    assert runs[0][2]["date"] == "2026-11-21" and runs[0][2]["kinds"] == ["users"]
    clock.t += dt.timedelta(days=1)  # the next night: still exactly one run, by the leader
    assert b.tick() == [] and [f["date"] for f in a.tick()] == ["2026-11-22"]
    assert len(_runs_of(rt, "t-two")) == 2


def test_rivals_that_both_think_they_lead_create_one_run(rt):
    """A lease lost in a pause (or a Redis that restarted empty) must not double a night."""
    clock = Clock(NOW)
    a = _scheduler(rt, "t-rival", clock, owner="a")
    b = _scheduler(rt, "t-rival", clock, owner="b")
    slot = a.due()[0]
    assert b.due() == [slot]
    first, second = a.fire(slot), b.fire(slot)
    assert (first["created"], second["created"]) == (True, False)
    assert first["run_id"] == second["run_id"]
    assert len(_runs_of(rt, "t-rival")) == 1
    queued = rt.redis.llen("rq:queue:farm")
    assert queued == 2  # one chunk per server's run of shards, queued once (resume found them)


def test_lease_expires_and_another_takes_over(rt):
    clock = Clock(NOW)
    a = _scheduler(rt, "t-lease", clock, owner="a", lease_seconds=0.3)
    b = _scheduler(rt, "t-lease", clock, owner="b", lease_seconds=0.3)
    assert a.lead() and not b.lead()
    time.sleep(0.5)  # a stopped renewing (paused, dead)
    assert b.lead() and not a.lead()
    b.resign()
    assert a.lead()


@pytest.mark.parametrize("forge", [lambda r, k: r.rpush(k, "x"), lambda r, k: r.set(k, "evil"),
                                   lambda r, k: r.set(k, "evil", ex=365 * 86400)])
def test_a_lease_key_that_is_not_a_lease_is_taken_over(rt, forge):
    """A list, a value with no expiry, or one that expires in a year, written at the lease's
    key: before, every tick failed (WRONGTYPE), or no scheduler led again (for good, or for
    the year), and the export never fired."""
    a = _scheduler(rt, "t-forged", Clock(NOW), owner="a")
    forge(rt.redis, a.key)
    assert a.lead() and rt.redis.get(a.key) == b"a" and rt.redis.pttl(a.key) > 0
    a.resign()
    assert not rt.redis.exists(a.key)


def test_missed_nights_are_caught_up_and_state_survives_redis(rt):
    clock = Clock(NOW)
    a = _scheduler(rt, "t-catch", clock, owner="a")
    assert [f["date"] for f in a.tick()] == ["2026-11-21"]
    a.resign()
    clock.t += dt.timedelta(days=3)  # three nights with no scheduler running
    rt.redis.flushdb()  # and Redis lost everything meanwhile
    b = _scheduler(rt, "t-catch", clock, owner="b")
    assert [f["date"] for f in b.tick()] == ["2026-11-22", "2026-11-23", "2026-11-24"]
    assert b.tick() == []
    assert len(_runs_of(rt, "t-catch")) == 4


# -- real scheduler processes -------------------------------------------------------------
def _cron_proc(env: dict, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scripts", "cron", "--name", name,
                             "--tables", "users"], env=env, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_cron_processes_fire_the_night_once_and_workers_export_it(farm_env, ledger,
                                                                      router, tmp_path):
    """Two ``farm cron`` processes (the Procfile's clock, twice) and real workers: the last
    night's export runs exactly once and lands under users/dt=<yesterday>/ with _SUCCESS."""
    env = {**farm_env, "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    r = redis.Redis.from_url(env["FARM_REDIS_URL"])
    r.flushdb()
    name = f"t-proc{int(time.time()) % 100000}"
    procs = [_cron_proc(env, name) for _ in range(2)]
    workers = start_workers(env, 2)
    try:
        slot = scheduler.slots_between(scheduler.DEFAULT_AT, None, scheduler.utcnow())[0]
        date = (slot.date() - dt.timedelta(days=1)).isoformat()
        success = tmp_path / "exp" / "users" / f"dt={date}" / "_SUCCESS"
        until(success.exists, timeout=90, what="the scheduled export's _SUCCESS")
        time.sleep(2 * scheduler.TICK_SECONDS)  # both schedulers tick again: nothing more fires
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=30) for p in procs]
        stop(workers)
        r.flushdb()
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    fired = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.strip()]
    assert [f["run_id"] for f in fired] == [scheduler.run_id_for(name, slot)]
    assert fired[0]["date"] == date and fired[0]["created"] is True
    manifest = json.loads((success.parent / "_manifest.json").read_text())
    assert len(manifest["files"]) == len(list(router.shardmap.shards()))
    again = run_farm(env, "cron", "--name", name, "--tables", "users", "--once")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["fired"] == []  # the slot is remembered in the control DB


def test_a_slot_whose_creator_died_before_queueing_is_queued(rt):
    """The run row exists but nothing was queued or recorded: the next fire queues it."""
    clock = Clock(NOW)
    a = _scheduler(rt, "t-died", clock, owner="a")
    slot = a.due()[0]
    params, chunks = exporter.plan(rt.router, "2026-11-21", rt.settings.export_url, ["users"])
    rt.ledger.create_run("export", "farm", {**params, "handler": exporter.HANDLER}, chunks,
                         run_id=scheduler.run_id_for("t-died", slot))
    assert rt.redis.llen("rq:queue:farm") == 0
    fired = a.tick()
    assert [(f["run_id"], f["created"]) for f in fired] == [(scheduler.run_id_for("t-died", slot),
                                                              False)]
    assert rt.redis.llen("rq:queue:farm") == 2 and a.due() == []


def _run_until(s: scheduler.Scheduler, stop_after_fire: bool = True,
               limit: float = 60) -> list[dict]:
    """``s.run`` ticking every 10 ms until a slot fires (or ``limit`` seconds, a guard that a
    scheduler looping on an error hits); what fired."""
    stop, fired = threading.Event(), []

    def on_fire(f: dict) -> None:
        fired.append(f)
        if stop_after_fire:
            stop.set()
    guard = threading.Timer(limit, stop.set)
    guard.start()
    try:
        s.run(stop, on_fire=on_fire, every=0.01)
    finally:
        guard.cancel()
    return fired


def test_a_failed_round_is_one_line_naming_its_slot_and_the_loop_goes_on(rt, monkeypatch,
                                                                        caplog):
    """The export's planning fails once (a dropped connection, injected at that step): one
    ERROR line names the slot and its run, without a traceback (at DEBUG only), and the
    next tick fires the slot. Before, the line was 'tick failed' with a full traceback."""
    real, calls = exporter.plan, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise TransientDatabaseError("lost connection to MySQL TestA1 (shard 7)")
        return real(*args, **kwargs)
    monkeypatch.setattr(exporter, "plan", flaky)
    caplog.set_level(logging.DEBUG, logger=scheduler.__name__)
    s = _scheduler(rt, "t-fail", Clock(NOW))
    fired = _run_until(s)
    run_id = scheduler.run_id_for("t-fail", dt.datetime(2026, 11, 22, 3, 0))
    assert [f["run_id"] for f in fired] == [run_id] and len(calls) == 2
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in lines] == [(
        "ERROR", f"cron t-fail: slot 2026-11-22T03:00:00Z (run {run_id}) failed: "
                 "TransientDatabaseError: lost connection to MySQL TestA1 (shard 7); trying "
                 "again in 0.01s", None)]
    assert [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]


def test_a_configuration_error_at_a_slot_ends_the_loop_in_one_line(rt, tmp_path):
    """A destination that cannot be used (a file where its root must go), met at a slot:
    every round would fail the same way, so the loop ends with one ``ConfigError`` naming
    the slot and the cause, and gives its lease up. Before, it logged a traceback every
    tick and never ended."""
    (tmp_path / "notes").write_text("not a directory")
    url = f"file://{tmp_path}/notes/exports"
    s = scheduler.Scheduler(rt, name="t-cfg", now=Clock(NOW),
                            export_args={"tables": ["users"], "dest": url})
    with pytest.raises(ConfigError) as caught:
        _run_until(s, limit=5)
    run_id = scheduler.run_id_for("t-cfg", dt.datetime(2026, 11, 22, 3, 0))
    assert str(caught.value) == (
        f"cron t-cfg: slot 2026-11-22T03:00:00Z (run {run_id}) failed: export destination "
        f"{url} cannot be used: cannot create export directory {tmp_path}/notes/exports: "
        "Not a directory; fix it and start farm cron again")
    assert type(caught.value) is ConfigError  # not a usage error: farm cron exits 1
    assert rt.redis.get(s.key) is None and _runs_of(rt, "t-cfg") == []
