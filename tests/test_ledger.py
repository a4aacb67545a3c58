"""The chunk ledger: claims, leases, fencing of zombies (in the ledger and on the shards)."""

import threading
import time

import pytest

from farmcore import control_schema, quarantine
from farmcore.ledger import ChunkSpec, ClaimRefused, Lease, Ledger, Outcome
from shardfarm.errors import FatalError, FencedError
from shardfarm.mysql.db import drop_database, ensure_database
from shardfarm.mysql.dsn import DSN
from sharding import fencing
from sharding.schema import shard_table
from tests.conftest import SHARDS_B, ns_db


def _run(ledger, n=3):
    return ledger.create_run("test", "q", {"x": 1}, [ChunkSpec("k", {"i": i}) for i in range(n)])


def test_claim_finish_and_run_status(ledger):
    run = _run(ledger, 2)
    assert ledger.run(run)["total_chunks"] == 2
    a = ledger.claim(run, 0, "w1")
    assert isinstance(a, Lease) and a.args == {"i": 0} and a.attempts == 1
    assert ledger.claim(run, 0, "w2") == ClaimRefused("leased")
    ledger.finish(a, Outcome(rows_read=5, rows_written=4, rows_quarantined=1))
    assert ledger.claim(run, 0, "w2") == ClaimRefused("done")
    assert ledger.refresh_status(run) == "running"
    b = ledger.claim(run, 1, "w1")
    ledger.finish(b, Outcome())
    assert ledger.refresh_status(run) == "done"
    assert ledger.chunk(run, 0)["rows_written"] == 4


def test_expired_lease_is_taken_over_and_zombie_fenced(ledger):
    run = _run(ledger, 1)
    zombie = ledger.claim(run, 0, "zombie", lease_seconds=0.2)
    time.sleep(0.3)
    assert ledger.expire_leases() >= 1
    lost = ledger.chunk(run, 0)
    assert lost["state"] == "pending" and "lease expired" in lost["last_error"]
    with pytest.raises(FencedError):
        ledger.finish(zombie, Outcome())
    heir = ledger.claim(run, 0, "heir")
    assert isinstance(heir, Lease) and heir.fence == zombie.fence + 1 and heir.attempts == 2
    for late in (lambda: ledger.finish(zombie, Outcome()), lambda: ledger.renew(zombie),
                 lambda: ledger.fail(zombie, "x", None)):
        with pytest.raises(FencedError):
            late()
    ledger.finish(heir, Outcome(rows_written=1))
    assert ledger.chunk(run, 0)["state"] == "done"


def test_zombie_write_on_shard_after_heir_is_refused(ledger, router):
    run = _run(ledger, 1)
    shard = SHARDS_B[0]
    q = shard_table(shard, "user_has_pins")
    zombie = ledger.claim(run, 0, "zombie", lease_seconds=0.1)
    time.sleep(0.2)
    heir = ledger.claim(run, 0, "heir")

    def write(token, to_id):
        def tx(cur):
            fencing.check(cur, shard, token)
            cur.execute(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (424242, %s, 1)",
                        (to_id,))
        router.run(shard, tx)
    write(heir.token, 1)
    with pytest.raises(FencedError):
        write(zombie.token, 2)
    rows = router.run(shard, lambda cur: (cur.execute(
        f"SELECT to_id FROM {q} WHERE from_id = 424242"), cur.fetchall())[1])
    assert [r[0] for r in rows] == [1]


def test_pause_refuses_claims(ledger):
    run = _run(ledger, 1)
    ledger.set_paused(run, True)
    assert ledger.claim(run, 0, "w") == ClaimRefused("paused")
    ledger.set_paused(run, False)
    assert isinstance(ledger.claim(run, 0, "w"), Lease)


def test_fail_with_backoff_then_failed_and_reset(ledger):
    run = _run(ledger, 1)
    a = ledger.claim(run, 0, "w")
    assert ledger.fail(a, "deadlock", retry_in=3600) == "pending"
    assert ledger.claim(run, 0, "w") == ClaimRefused("not_before")
    # the back-off ends: the database's clock is the ledger's, so its deadline is moved
    # (no sleep: a claim slowed by load must not outlive a short window)
    ledger.pool.execute("UPDATE chunks SET not_before = NOW(3) - INTERVAL 1 SECOND "
                        "WHERE run_id = %s AND chunk_id = 0", (run,))
    b = ledger.claim(run, 0, "w")
    assert isinstance(b, Lease) and b.attempts == 2
    assert ledger.fail(b, "bad input", retry_in=None) == "failed"
    assert ledger.refresh_status(run) == "failed"
    assert ledger.unfinished(run) == [] and ledger.unfinished(run, include_failed=True) == [0]
    assert ledger.reset_failed(run) == 1
    assert isinstance(ledger.claim(run, 0, "w"), Lease)


def test_unknown_run(ledger):
    with pytest.raises(FatalError, match="no run"):
        ledger.run("nope")
    assert ledger.claim("nope", 0, "w") == ClaimRefused("missing")


def test_active_runs_have_a_live_lease_or_a_claim_since_the_time_asked(ledger):
    kind = f"act{time.monotonic_ns() % 10**9}"
    idle = ledger.create_run(kind, "q", {}, [ChunkSpec("k", {"i": 0})])
    work = ledger.create_run(kind, "q", {}, [ChunkSpec("k", {"i": 0})])
    runs, before = ledger.active_runs(kind)
    assert runs == []  # pending chunks write nothing
    lease = ledger.claim(work, 0, "w1")
    assert ledger.active_runs(kind)[0] == [work]
    ledger.finish(lease, Outcome())
    assert ledger.active_runs(kind, since=before)[0] == [work]  # at work since ``before``
    back = "UPDATE chunks SET {} WHERE run_id = %s"
    ledger.pool.execute(back.format("started_at = started_at - INTERVAL 1 HOUR, "
                                    "finished_at = finished_at - INTERVAL 1 HOUR"), (work,))
    assert ledger.active_runs(kind)[0] == []
    assert ledger.active_runs(kind, grace=7200)[0] == []  # claimed then, but finished then
    ledger.claim(idle, 0, "w2")
    ledger.pool.execute(back.format("lease_expires = NOW(3) - INTERVAL 30 SECOND, "
                                    "started_at = started_at - INTERVAL 1 HOUR"), (idle,))
    assert ledger.active_runs(kind)[0] == []  # its lease expired
    assert ledger.active_runs(kind, grace=60)[0] == [idle]  # a statement may still run


def test_chunks_of_a_run_record_their_quarantine_without_waiting_for_each_other(ledger):
    """Each record deletes the chunk's earlier rows: without an index on the chunk, that
    DELETE locked every quarantined row of the run, so one chunk's open record held up every
    other chunk's (here: chunk 2's waits for chunk 0's transaction to end)."""
    run = _run(ledger, 3)
    leases = [ledger.claim(run, c, "w") for c in range(3)]
    for c, lease in enumerate(leases):
        ledger.quarantine.record(lease, [("pins", str(100 * c + k), "missing_board", None)
                                         for k in range(50)])
    done = threading.Event()
    with ledger.pool.connection() as held:
        held.begin()
        with held.cursor() as cur:  # chunk 0's record, in flight
            cur.execute(quarantine.CHUNK_ROWS, (run, 0))
        worker = threading.Thread(target=lambda: (ledger.quarantine.record(
            leases[2], [("pins", "777", "missing_board", None)]), done.set()), daemon=True)
        worker.start()
        recorded = done.wait(20)
        held.rollback()
    worker.join(60)
    assert recorded, "chunk 2's record waited for chunk 0's transaction"
    keys = {r["legacy_key"] for r in ledger.quarantine.rows(run)}
    assert "777" in keys and "249" not in keys and "0" in keys


def test_quarantine_is_replaced_by_the_current_attempt_only(ledger):
    """A chunk's record replaces what its earlier attempts recorded (a row loaded now
    leaves the quarantine); a zombie attempt's late record is refused and changes nothing."""
    run = _run(ledger, 2)
    zombie = ledger.claim(run, 0, "zombie")
    ledger.quarantine.record(zombie, [("boards", "5", "missing_owner", "user_id=9"),
                                      ("boards", "6", "zero_created_at", None)])
    ledger.pool.execute("UPDATE chunks SET lease_expires = NOW(3) - INTERVAL 1 SECOND "
                        "WHERE run_id = %s AND chunk_id = 0", (run,))
    heir = ledger.claim(run, 0, "heir")
    other = ledger.claim(run, 1, "heir")
    ledger.quarantine.record(other, [("boards", "90", "missing_owner", "user_id=3")])
    ledger.quarantine.record(heir, [("boards", "6", "zero_created_at", None)])
    with pytest.raises(FencedError):
        ledger.quarantine.record(zombie, [("boards", "5", "missing_owner", "user_id=9")])
    assert [(r["legacy_key"], r["reason"]) for r in ledger.quarantine.rows(run)] == [
        ("6", "zero_created_at"), ("90", "missing_owner")]


@pytest.fixture
def zoned_ledgers(server_b):
    """``make()`` opens a ledger (new sessions) on a control database of the private server
    (``dsn``); ``zone(z)`` sets the server's default time zone, as a host's daylight-saving
    jump or a server configured in another zone would. Both are undone afterwards."""
    dsn = DSN.parse(f"mysql://root@127.0.0.1:{server_b.port}/{ns_db('farm_control_zoned')}")
    ensure_database(dsn)
    control_schema.ensure(dsn)
    (was,), = server_b.sql("SELECT @@GLOBAL.time_zone")
    opened = []

    def make() -> Ledger:
        opened.append(Ledger(dsn))
        return opened[-1]
    try:
        yield make, lambda z: server_b.sql(f"SET GLOBAL time_zone = '{z}'"), dsn
    finally:
        server_b.sql(f"SET GLOBAL time_zone = '{was}'")
        for led in opened:
            led.close()
        drop_database(dsn)


def test_a_live_lease_stays_live_when_the_servers_zone_jumps_ahead(zoned_ledgers):
    make, zone, _ = zoned_ledgers
    zone("-05:00")
    holder = make()
    run = _run(holder, 1)
    lease = holder.claim(run, 0, "holder", lease_seconds=600)
    zone("+05:00")  # sessions opened from now on see the server's clock 10 hours later
    other = make()
    assert other.expire_leases() == 0
    assert other.claim(run, 0, "other") == ClaimRefused("leased")
    holder.finish(lease, Outcome(rows_written=1))  # never fenced out
    assert other.chunk(run, 0)["state"] == "done"


def test_an_expired_lease_expires_when_the_servers_zone_jumps_back(zoned_ledgers):
    make, zone, _ = zoned_ledgers
    zone("+05:00")
    dead = make()
    run = _run(dead, 1)
    dead.claim(run, 0, "dead", lease_seconds=0.2)
    time.sleep(0.3)
    zone("-05:00")  # sessions opened from now on see the server's clock 10 hours earlier
    reaper = make()
    assert reaper.expire_leases() == 1
    assert isinstance(reaper.claim(run, 0, "heir"), Lease)


def test_a_cancelled_chunk_in_hand_counts_as_at_work_until_its_worker_is_fenced(ledger):
    """Its worker writes until its next renewal: 'farm sync' must not apply meanwhile
    (``active_runs``), and the retry-failed of every run leaves the run alone even when the
    cancel lands after it listed the runs; only a retry of that run takes it up again."""
    run = ledger.create_run("canceltest", "q", {}, [ChunkSpec("k", {"i": i}) for i in range(2)])
    held = ledger.claim(run, 0, "w", lease_seconds=600)
    assert ledger.cancel(run) == 2
    assert ledger.active_runs("canceltest")[0] == [run]
    with pytest.raises(FencedError):
        ledger.renew(held)
    assert ledger.reset_failed(run, cancelled=False) == 0
    assert ledger.chunk(run, 0)["state"] == "failed"
    assert run not in ledger.runs(limit=1000, unfinished=True)
    assert ledger.reset_failed(run) == 2
    assert ledger.chunk(run, 0)["state"] == "pending" and ledger.refresh_status(run) == "running"
    assert ledger.active_runs("canceltest")[0] == []
    assert run in ledger.runs(limit=1000, unfinished=True)


def test_cancelling_a_run_with_nothing_left_leaves_it_as_it_ended(ledger):
    run = _run(ledger, 1)
    ledger.fail(ledger.claim(run, 0, "w"), "boom", None)
    assert ledger.cancel(run) == 0
    assert run in ledger.runs(limit=1000, unfinished=True)  # a retry of every run takes it
    assert ledger.run(run)["status"] == "failed" and ledger.run(run)["cancelled_at"] is None


def test_runs_an_older_farm_cancelled_are_named_cancelled_by_the_schema_upgrade(ledger,
                                                                               settings):
    """A run cancelled before the status ``cancelled`` was stored as ``failed``; the next
    ``control_schema.ensure`` (a run started, 'farm shards init') names it as it is now."""
    old, failed = _run(ledger, 1), _run(ledger, 1)
    ledger.cancel(old)
    ledger.fail(ledger.claim(failed, 0, "w"), "boom", None)
    ledger.refresh_status(failed)
    ledger.pool.execute("UPDATE runs SET status = 'failed' WHERE run_id = %s", (old,))
    control_schema.ensure(settings.control_dsn)
    assert ledger.run(old)["status"] == "cancelled"
    assert ledger.run(failed)["status"] == "failed"  # a run that failed on its own stays so


def test_a_cancelled_run_ends_as_cancelled_until_a_retry_of_it_takes_it_up(ledger):
    """Before, a cancelled run's status was ``failed``, like a run whose chunks failed."""
    run = _run(ledger, 3)
    ledger.finish(ledger.claim(run, 0, "w"), Outcome(rows_written=7))
    held = ledger.claim(run, 1, "w")
    assert ledger.cancel(run) == 2
    assert ledger.refresh_status(run) == "cancelled"
    got = ledger.run(run)
    assert got["status"] == "cancelled" and got["cancelled_at"] is not None
    listed = next(r for r in ledger.list_runs(limit=1000) if r["run_id"] == run)
    assert (listed["status"], listed["chunks_done"], listed["chunks_failed"],
            listed["rows_written"]) == ("cancelled", 1, 2, 7)
    with pytest.raises(FencedError):  # its worker's end changes nothing
        ledger.finish(held, Outcome())
    assert ledger.refresh_status(run) == "cancelled"
    assert ledger.reset_failed(run) == 2  # taken up again: its own status once more
    assert ledger.run(run)["status"] == "running" and ledger.run(run)["cancelled_at"] is None
    ledger.finish(ledger.claim(run, 1, "w"), Outcome())
    ledger.fail(ledger.claim(run, 2, "w"), "boom", None)
    assert ledger.refresh_status(run) == "failed"


def test_a_retry_between_a_refresh_s_sums_and_its_write_leaves_the_run_running(ledger,
                                                                                 monkeypatch):
    """A refresh found no chunk left (the last one had failed) and summed the chunks; a
    ``farm retry-failed`` then put that chunk back to pending and the run to running. The
    refresh's write used to mark the run failed over that, and return ``failed``: a
    ``--wait`` on the run exited 1 while its chunk ran again, and housekeeping dispatches no
    chunk of a run that is not running."""
    run = _run(ledger, 1)
    ledger.fail(ledger.claim(run, 0, "w"), "bad input", retry_in=None)
    real = ledger.pool.query

    def query(sql, params=()):  # the barrier: the retry lands right after the sums
        rows = real(sql, params)
        if "SUM(state = 'failed')" in sql:
            assert ledger.reset_failed(run) == 1
        return rows
    monkeypatch.setattr(ledger.pool, "query", query)
    assert ledger.refresh_status(run) == "running"
    monkeypatch.setattr(ledger.pool, "query", real)
    assert ledger.run(run)["status"] == "running"
    assert ledger.chunk(run, 0)["state"] == "pending"
    ledger.finish(ledger.claim(run, 0, "w"), Outcome())
    assert ledger.refresh_status(run) == "done"


def test_a_refresh_that_saw_a_chunk_at_work_does_not_undo_the_run_s_end(ledger, monkeypatch):
    """A refresh read that a chunk was still running; that chunk then finished and its own
    refresh wrote the run done. The first refresh's write used to put the run back to
    running over that, with nothing left to run (it stayed so until something refreshed it
    again)."""
    run = _run(ledger, 1)
    lease = ledger.claim(run, 0, "w")
    real = ledger.pool.query
    ended: list[str] = []

    def query(sql, params=()):  # the barrier: the chunk ends right after the busy read
        rows = real(sql, params)
        if sql.startswith("SELECT EXISTS") and not ended:
            ended.append("now")
            monkeypatch.setattr(ledger.pool, "query", real)
            ledger.finish(lease, Outcome())
            ended.append(ledger.refresh_status(run))
        return rows
    monkeypatch.setattr(ledger.pool, "query", query)
    ledger.refresh_status(run)
    assert ended == ["now", "done"]
    assert ledger.run(run)["status"] == "done"
