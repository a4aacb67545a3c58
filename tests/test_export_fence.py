"""Exports are fenced to the end: a zombie frozen right before its part becomes visible never
replaces what its successor finalized; a wrong part of the right size is written again; one
run at a time writes a folder; the finalize lock outlives the connections that took it."""

import contextlib
import gzip
import hashlib
import json
import os
import signal

import pymysql
import pytest

from exporters import export as exporter
from exporters.destinations import FileDestination, open_destination
from exporters.partlog import FolderBusyError, PartLog
from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Ledger
from jobs import runs
from jobs.lifecycle import Renewer
from shardfarm.errors import FencedError, RetryableError
from tests.conftest import SHARDS_A, run_farm
from tests.farmkit import start_workers, stop, until
from tests.test_export import BASE, BUCKET, DATE, data, s3  # noqa: F401 - fixtures

FROZEN = "tests.kinds.export_frozen"


@pytest.fixture
def env(env, s3):  # noqa: F811 - the suite's env, with the S3 server's
    return {**env, **s3["env"]}


def _params(dest_url: str, **extra) -> dict:
    return {"kinds": ["users"], "date": DATE, "dest": dest_url, "format": "jsonl",
            "from": "master", "force": False, **extra}


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _zombie_then_heir(rt, env, router, dest_url: str, tmp_path, part_size: int = 0) -> str:
    """One export chunk whose first attempt freezes right before its part becomes visible;
    while it is frozen the row changes, its lease expires and a second worker exports and
    finalizes the folder; then the zombie is released and runs to its end. Returns the
    zombie's log."""
    shard, marker = SHARDS_A[0], tmp_path / "frozen.pid"
    args = {"table": "users", "shard": shard, "freeze_once": str(marker), "part_size": part_size}
    run_id = runs.start(rt, "export", FROZEN, [ChunkSpec("users", args)], _params(dest_url))
    zombie, pid = start_workers(env, 1), None
    try:
        until(lambda: marker.exists() and marker.read_text(), what="the zombie at its commit")
        pid = int(marker.read_text())
        until(lambda: _stopped(pid), what="the zombie frozen")
        os.kill(zombie.pid, signal.SIGSTOP)  # its supervisor too, so it cannot help
        router.run(shard, lambda cur: cur.execute(
            f"UPDATE `db{shard:05d}`.`users` SET data = JSON_SET(data, '$.after', 1) "
            "WHERE local_id = %s", (BASE,)))
        heir = start_workers(env, 1)
        try:
            assert runs.wait(rt, run_id, timeout=90) == "done"
        finally:
            stop(heir)
        assert rt.ledger.chunk(run_id, 0)["fence"] >= 2
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        if pid:
            os.kill(pid, signal.SIGCONT)  # the zombie wakes at its commit
        out = stop(zombie)  # a warm stop: the zombie's job runs to its end first
    return out


def _assert_heirs_part_stands(dest, folder: str, zombie_log: str) -> None:
    manifest = json.loads(dest.read(folder + "_manifest.json"))
    (entry,) = manifest["files"]
    body = dest.read(folder + entry["path"])
    assert (len(body), _sha(body)) == (entry["bytes"], entry["sha256"])
    assert b'"after"' in gzip.decompress(body)  # the heir's, written after the change
    assert dest.exists(folder + "_SUCCESS")
    assert "taken over" in zombie_log


@pytest.fixture
def restore_row(router, data):  # noqa: F811 - the data fixture
    yield
    shard = SHARDS_A[0]
    router.run(shard, lambda cur: cur.execute(
        f"UPDATE `db{shard:05d}`.`users` SET data = JSON_REMOVE(data, '$.after') "
        "WHERE local_id = %s", (BASE,)))


@pytest.mark.slow
def test_zombie_frozen_before_rename_never_replaces_the_finalized_part(
        rt, env, router, tmp_path, restore_row):
    url = f"file://{tmp_path}/exp"
    out = _zombie_then_heir(rt, env, router, url, tmp_path)
    folder = f"users/dt={DATE}/"
    _assert_heirs_part_stands(open_destination(url), folder, out)
    assert not [p for p in (tmp_path / "exp").rglob(".*")]  # the zombie's temp file is gone


@pytest.mark.slow
def test_zombie_frozen_before_multipart_completion_never_replaces_the_finalized_part(
        rt, env, router, tmp_path, s3, restore_row, monkeypatch):  # noqa: F811
    import moto.s3.models
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1)  # small parts here
    prefix = f"fence-{os.getpid()}"
    url = f"s3://{BUCKET}/{prefix}"
    out = _zombie_then_heir(rt, env, router, url, tmp_path, part_size=64)
    folder = f"users/dt={DATE}/"
    _assert_heirs_part_stands(open_destination(url), folder, out)
    assert not s3["client"].list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_wrong_part_of_the_right_size_is_exported_again(ledger, router, tmp_path, data):  # noqa: F811
    dest = FileDestination(tmp_path)
    params = {**_params(dest.url), "handler": exporter.HANDLER}
    shard = SHARDS_A[0]
    folder, name = f"users/dt={DATE}/", exporter.part_name(shard, "jsonl")

    def one_run() -> bool:
        run_id = ledger.create_run("export", "farm", params, [
            ChunkSpec("users", {"table": "users", "shard": shard})])
        lease = ledger.claim(run_id, 0, "test-owner")
        out = exporter.export_chunk(ChunkContext(None, router, ledger, lease, params), "users",
                                  shard)
        ledger.finish(lease, out)
        ledger.refresh_status(run_id)
        return bool(out.counts["skipped"])

    assert one_run() is False
    good = dest.read(folder + name)
    assert one_run() is True  # intact: skipped
    path = tmp_path / folder / name
    path.write_bytes(bytes(b ^ 0xFF for b in good))  # same size, other bytes
    assert one_run() is False  # written again
    assert dest.read(folder + name) == good


def test_two_runs_of_one_date_never_write_a_folder_at_once(ledger, router, tmp_path, data):  # noqa: F811
    dest = FileDestination(tmp_path)
    params = {**_params(dest.url), "handler": exporter.HANDLER}
    shards = [SHARDS_A[0], SHARDS_A[0] + 3]
    runs_ = [ledger.create_run("export", "farm", params, [
        ChunkSpec("users", {"table": "users", "shard": s}) for s in shards]) for _ in range(2)]
    ctx = [ChunkContext(None, router, ledger, ledger.claim(r, 0, "test-owner"), params)
           for r in runs_]
    exporter.export_chunk(ctx[0], "users", shards[0])  # the first run writes the folder
    with pytest.raises(FolderBusyError, match=runs_[0]):
        exporter.export_chunk(ctx[1], "users", shards[0])  # the second waits for it
    folder = f"users/dt={DATE}/"
    log_ = PartLog(ledger.pool, dest.url)
    assert [p.shard for p in log_.of_run(folder, runs_[0])] == shards[:1]
    assert log_.of_run(folder, runs_[1]) == []
    for r, c in zip(runs_, ctx, strict=True):  # end both (the second's chunk failed)
        ledger.fail(c.lease, "test", None)
        ledger.refresh_status(r)
    assert not dest.exists(folder + "_SUCCESS")


@pytest.mark.slow
def test_second_export_of_one_date_is_refused_naming_the_first(env, rt, tmp_path):
    url = f"file://{tmp_path}/cli"
    first = run_farm(env, "export", "--date", DATE, "--dest", url, "--tables", "users")
    assert first.returncode == 0, first.stderr
    run_id = json.loads(first.stdout.strip().splitlines()[-1])["run_id"]
    try:
        second = run_farm(env, "export", "--date", DATE, "--dest", url, "--tables",
                          "pins,users")
        assert second.returncode == 1
        assert second.stderr.count("\n") == 1 and run_id in second.stderr
        other = run_farm(env, "export", "--date", "2026-11-20", "--dest", url, "--tables",
                         "users")
        assert other.returncode == 0, other.stderr  # another date is another folder
        for line in (first, other):
            rid = json.loads(line.stdout.strip().splitlines()[-1])["run_id"]
            rt.ledger.set_paused(rid, True)
    finally:
        for rid in rt.ledger.runs(limit=5, active_only=True):
            if rt.ledger.run(rid)["params"].get("dest") == url:
                rt.ledger.pool.execute("UPDATE chunks SET state = 'failed' WHERE run_id = %s",
                                       (rid,))
                rt.ledger.refresh_status(rid)


def _kill_control_connections(settings, spare: list[int]) -> int:
    """Drop every session on the control database but this one and ``spare`` (the test
    session's ledger): what a server does to idle connections after ``wait_timeout``."""
    dsn = settings.control_dsn
    conn = pymysql.connect(host=dsn.host, port=dsn.port, user=dsn.user,
                           password=dsn.password or "", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                        "AND ID != CONNECTION_ID()", (dsn.database,))
            ids_ = [r[0] for r in cur.fetchall() if r[0] not in spare]
            for i in ids_:
                with contextlib.suppress(pymysql.MySQLError):  # already gone
                    cur.execute(f"KILL CONNECTION {int(i)}")
        return len(ids_)
    finally:
        conn.close()


def test_finalize_lock_survives_its_connections_being_dropped(settings, ledger, tmp_path):
    a, b = Ledger(settings.control_dsn), Ledger(settings.control_dsn)
    try:
        url = f"file://{tmp_path}"
        holder, other = PartLog(a.pool, url), PartLog(b.pool, url)
        with holder.lock("users/dt=x/"):
            spare = [c.thread_id() for c, _ in ledger.pool._idle]
            assert _kill_control_connections(settings, spare) >= 1
            with pytest.raises(RetryableError), other.lock("users/dt=x/", 0):
                pass  # still held
        with other.lock("users/dt=x/", 0):  # released by its holder
            pass
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_renewer_stops_the_attempt_when_it_cannot_renew_in_time(ledger, monkeypatch):
    """The control database stops answering (a port nothing listens on): every renewal
    fails, and the attempt is stopped at the lease's own deadline, not left running."""
    from shardfarm.mysql.dsn import DSN
    from tests.servers import free_port
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "1")
    run_id = ledger.create_run("export", "farm", {}, [ChunkSpec("x", {})])
    lease = ledger.claim(run_id, 0, "test-owner", lease_seconds=2)
    gone = Ledger(DSN.parse(f"mysql://root@127.0.0.1:{free_port()}/nothing"))
    ctx = ChunkContext(None, None, gone, lease, {})
    try:
        with Renewer(ctx, seconds=2.0):
            ctx.check()  # a fresh lease: go on
            until(lambda: ctx.lost.is_set(), timeout=10, what="the attempt stopped")
            with pytest.raises(FencedError, match="lease lost"):
                ctx.check()
    finally:
        gone.close()
        ledger.fail(lease, "test", None)
        ledger.refresh_status(run_id)
