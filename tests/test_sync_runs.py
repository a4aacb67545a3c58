"""``farm sync`` and the migrate runs it follows, on a private mariadbd writing a ROW binlog:
a migration started while sync follows makes it wait and then follow that run from its
own position (a chunk frozen between its legacy read and its target writes, while the
application changes a row of that chunk, leaves the target exact); a failed run is not
followed, and cut-over says what sync waits for; a partial row image a client logged
for its own session stops sync in one line, and the advised re-run brings it back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from farmcore.ledger import ChunkSpec
from farmcore.quarantine import Quarantine
from loaders.migration import migrate as migration
from loaders.migration import runwatch, sync
from shardfarm.errors import FencedError
from shardfarm.mysql.dsn import DSN
from shardfarm.settings import Settings
from sharding.fencing import FenceToken
from tests import faults
from tests.conftest import run_farm
from tests.dashkit import dashboard, get
from tests.farmkit import stop
from tests.migratekit import last_json
from tests.synckit import exact, legacy_server, live, load, start_sync  # noqa: F401 - fixtures

QUEUE = "sync-tests-nobody-listens"  # the test runs these runs' chunks itself


def _position(server) -> str:
    return server.sql("SELECT @@gtid_binlog_pos")[0][0]


def _caught_up(ledger, server) -> bool:
    return ledger.sync_state.read().get("gtid") == _position(server)


def _forget_position(ledger) -> None:
    """Sync starts afresh from the next run it follows. The lease's fence is kept: shard
    fence rows of earlier leaders keep theirs, and a lower one would be refused there."""
    ledger.pool.execute("UPDATE sync_state SET run_id = NULL, gtid = NULL, applied = NULL, "
                        "applying_from = NULL, applying_fence = NULL")


def _migrate(env: dict) -> str:
    """``farm migrate --wait`` (it must succeed); its run ID."""
    out = run_farm(env, "migrate", "--wait", timeout=600)
    assert out.returncode == 0, out.stderr
    return last_json(out.stdout)["run_id"]


def _valid_user(server) -> int:
    """A legacy user that is migrated (username and date present)."""
    (user,), = server.sql("SELECT MIN(id) FROM legacy.users WHERE username IS NOT NULL AND "
                          "created_at IS NOT NULL")
    return user


def _users_only_run(settings, router, ledger) -> str:
    """A migrate run of one chunk, the whole ``users`` table, planned as ``farm migrate``
    plans (its binlog position taken first) but enqueued nowhere: the test runs it."""
    params, chunks = migration.plan(settings, router, ledger, chunk_rows=10**9)
    users: ChunkSpec = next(c for c in chunks if c.kind == "users")
    run_id = ledger.create_run("migrate", QUEUE,
                               {**params, "handler": migration.HANDLER}, [users])
    return run_id


@pytest.mark.slow
def test_a_migration_started_while_sync_follows_loses_no_change(
        live, settings, router, ledger, map_path, legacy_server, tmp_path,  # noqa: F811
        monkeypatch):
    _forget_position(ledger)
    first = _migrate(live)
    log = tmp_path / "sync.log"
    sync = start_sync(live, log)
    try:
        faults.wait_until(lambda: _caught_up(ledger, legacy_server), "sync to catch up")
        user = _valid_user(legacy_server)
        second = _users_only_run(Settings.from_env(live), router, ledger)
        # the chunk has read the legacy users, and reads the target next
        monkeypatch.setenv("FARM_FAULT_MATCH", "legacy_id_map")
        args = {"shardmap": str(map_path), "env": live, "run_id": second, "chunk_id": 0}
        with faults.frozen("migrate_chunk", args, 1):
            load(legacy_server, [f"UPDATE users SET full_name = 'changed after the read' "
                                 f"WHERE id = {user}"])
            # sync either stops for the new run, or applies the change the chunk missed
            faults.wait_until(lambda: f"migrate run {second}" in log.read_text()
                              or _caught_up(ledger, legacy_server), "sync to see the change")
            doc = last_json(run_farm(live, "sync", "status").stdout)
            assert doc.get("waiting_for") == f"migrate run {second} (running)", doc
            waiting = f"waiting for migrate run {second} (running)"
            assert waiting in run_farm(live, "status").stdout
            with dashboard(live) as (url, _):
                code, page = get(url + "fragment")
            assert code == 200 and f'id="sync-waiting">{waiting}' in page, page[-3000:]
        assert ledger.run(second)["status"] == "done"
        faults.wait_until(lambda: _caught_up(ledger, legacy_server), "sync to catch up again")
        assert ledger.sync_state.read()["run_id"] == second  # followed from its position
        # the whole target, against the first run's quarantine (the second had users only)
        problems = exact(legacy_server, settings, map_path, first)
        assert problems == [], "\n".join(problems)
    finally:
        stop(sync)
    assert f"migrate run {second} is at work or new: sync waits" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["new run, lease kept", "new run, lease lost", "older run"])
def test_a_migration_at_work_during_an_apply_has_that_apply_made_again(
        live, settings, router, ledger, map_path, legacy_server, monkeypatch,  # noqa: F811
        case):
    """Sync frozen inside an apply (it read a user's row, its first write not sent) while
    the row changes again and a migration chunk of it runs whole (of a new run, or of an
    older one left unfinished): the apply then writes the older row over the chunk's.
    Sync must apply again from before that apply: seeing the chunk when the apply ends
    (lease kept; for the older run by its claim since the check before the apply), or,
    when the apply was never recorded (lease lost inside it), when it follows anew."""
    _forget_position(ledger)
    older = _users_only_run(Settings.from_env(live), router, ledger) \
        if case == "older run" else None
    first = _migrate(live)
    assert run_farm(live, "sync", "--until-caught-up", timeout=120).returncode == 0
    user = _valid_user(legacy_server)
    change = "UPDATE users SET full_name = '{}' WHERE id = " + str(user)
    load(legacy_server, [change.format("read by sync")])
    monkeypatch.setenv("FARM_FAULT_MATCH", "chunk_fences` WHERE run_id")  # first shard write
    with faults.frozen("sync", {"shardmap": str(map_path), "env": live}, 1):
        load(legacy_server, [change.format("read by the migration")])
        chunk_of = older or _users_only_run(Settings.from_env(live), router, ledger)
        monkeypatch.delenv("FARM_FAULT_MATCH")
        faults.steps("migrate_chunk", {"shardmap": str(map_path), "env": live,
                                       "run_id": chunk_of, "chunk_id": 0})  # runs it whole
        assert ledger.run(chunk_of)["status"] == "done"
        if case.endswith("lost"):  # a standby took the lease over meanwhile, and left it
            ledger.pool.execute("UPDATE sync_state SET fence = fence + 1, owner = 'standby', "
                                "expires = NOW(3) - INTERVAL 1 SECOND")
        else:  # however long the freeze took
            ledger.pool.execute("UPDATE sync_state SET expires = NOW(3) + INTERVAL 60 SECOND")
    assert _caught_up(ledger, legacy_server)
    assert ledger.sync_state.read()["run_id"] == (first if older else chunk_of)
    problems = exact(legacy_server, settings, map_path, first)
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
def test_an_apply_killed_half_way_is_noted_until_made_again(
        live, ledger, map_path, legacy_server, monkeypatch):  # noqa: F811
    """A leader SIGKILLed inside an apply leaves a note of where it began; the next
    leader's checkpoint past that apply's end clears it (else a later run would be
    followed from that old position, maybe long purged)."""
    _forget_position(ledger)
    _migrate(live)
    assert run_farm(live, "sync", "--until-caught-up", timeout=120).returncode == 0
    load(legacy_server, ["UPDATE users SET full_name = 'killed inside' ORDER BY id LIMIT 1"])
    monkeypatch.setenv("FARM_FAULT_MATCH", "chunk_fences` WHERE run_id")
    assert faults.run_killed("sync", {"shardmap": str(map_path), "env": live}, 1) == -9
    monkeypatch.delenv("FARM_FAULT_MATCH")
    noted = ledger.sync_state.read()
    assert noted["applying_from"] == noted["gtid"] and noted["applying_to"] is not None
    ledger.pool.execute("UPDATE sync_state SET expires = NOW(3) - INTERVAL 1 SECOND")
    assert run_farm(live, "sync", "--until-caught-up", timeout=120).returncode == 0
    assert ledger.sync_state.read()["applying_from"] is None


@pytest.mark.slow
def test_an_older_run_holds_sync_up_only_while_it_works(
        live, settings, router, ledger, map_path, legacy_server, tmp_path,  # noqa: F811
        monkeypatch):
    """An older migrate run left unfinished (nobody runs its chunks) writes nothing: sync
    follows the latest run all the same. Once one of its chunks is at work (re-opened by
    ``farm retry-failed``, say) it writes as a migration does, and sync waits for it."""
    older = _users_only_run(Settings.from_env(live), router, ledger)  # never run
    latest = _migrate(live)
    log = tmp_path / "sync.log"
    sync = start_sync(live, log)
    try:
        faults.wait_until(lambda: _caught_up(ledger, legacy_server)
                          and ledger.sync_state.read()["run_id"] == latest, "sync to follow")
        monkeypatch.setenv("FARM_FAULT_MATCH", "legacy_id_map")  # its first target read
        args = {"shardmap": str(map_path), "env": live, "run_id": older, "chunk_id": 0}
        with faults.frozen("migrate_chunk", args, 1):
            faults.wait_until(lambda: f"migrate run {older} is at work or new: sync waits"
                              in log.read_text(), "sync to wait for the older run at work")
            doc = last_json(run_farm(live, "sync", "status").stdout)
            assert doc["waiting_for"] == f"migrate run {older} (running)", doc
            load(legacy_server, [f"UPDATE users SET full_name = 'while it works' WHERE id = "
                                 f"{_valid_user(legacy_server)}"])
        faults.wait_until(lambda: _caught_up(ledger, legacy_server), "sync to catch up")
        assert ledger.sync_state.read()["run_id"] == latest
        problems = exact(legacy_server, settings, map_path, latest)
        assert problems == [], "\n".join(problems)
    finally:
        stop(sync)


@pytest.mark.slow
def test_cutover_waits_for_sync_to_follow_the_latest_migration(
        live, router, ledger, map_path, legacy_server):  # noqa: F811
    """While a migration runs, cut-over says sync waits for it; once it has ended with no
    change since, sync follows it (its checkpoint names the new run) and cut-over passes.
    With no 'farm sync' running at all, cut-over says so once while it waits (it said
    nothing until its timeout)."""
    _migrate(live)
    out = run_farm(live, "cutover", "--timeout", "7", timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("farm: note: no 'farm sync' holds sync's lease: none is running: "
                            "start 'farm sync' (cutover waits up to 7 s") == 1, out.stderr
    sync = start_sync(live)
    try:
        faults.wait_until(lambda: _caught_up(ledger, legacy_server), "sync to catch up")
        third = _users_only_run(Settings.from_env(live), router, ledger)
        out = run_farm(live, "cutover", "--timeout", "2", timeout=120)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert f"(it waits for migrate run {third} (running)); nothing was cut over" in lines[-1]
        faults.steps("migrate_chunk", {"shardmap": str(map_path), "env": live,
                                       "run_id": third, "chunk_id": 0})  # runs it, no fault
        assert ledger.run(third)["status"] == "done"
        out = run_farm(live, "cutover", "--timeout", "60", timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 mismatch(es)" in out.stdout
        assert ledger.sync_state.read()["run_id"] == third
    finally:
        stop(sync)


@pytest.mark.slow
@pytest.mark.parametrize(("status", "says"), [("failed", "ended with failed chunks"),
                                              ("cancelled", "was cancelled ('farm cancel')")])
def test_a_failed_or_cancelled_run_is_not_followed(live, ledger, status, says):  # noqa: F811
    """Before, a run that 'farm cancel' ended (status ``cancelled``) was followed as if done."""
    run_id = ledger.latest_run("migrate")
    ledger.pool.execute("UPDATE runs SET status = %s, cancelled_at = IF(%s = 'cancelled', "
                        "NOW(3), NULL) WHERE run_id = %s", (status, status, run_id))
    try:
        waits = runwatch.waiting_for(ledger, None)
        out = run_farm(live, "sync", "--until-caught-up", timeout=120)
    finally:
        ledger.pool.execute("UPDATE runs SET status = 'done', cancelled_at = NULL WHERE "
                            "run_id = %s", (run_id,))
    assert waits == (f"migrate run {run_id} ({status}: 'farm retry-failed --run {run_id}' or "
                     "a new 'farm migrate')")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"migrate run {run_id} {says}" in lines[0], out.stderr
    assert f"farm retry-failed --run {run_id}" in lines[0], out.stderr
    assert ledger.sync_state.read()["expires"] is None  # the refusal gave its lease back


@pytest.mark.slow
def test_sync_stops_at_a_partial_row_image_in_one_line(live, ledger, legacy_server):  # noqa: F811
    """A client that logs MINIMAL images for its own session (the server's setting is FULL)
    stops sync with exit 1 and one line naming the table; after the advised re-run of the
    migration, sync follows again."""
    _forget_position(ledger)
    _migrate(live)
    conn = legacy_server.connect(database="legacy")
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("UPDATE pins SET board_id = board_id + 1 ORDER BY id LIMIT 1")
    conn.commit()
    conn.close()
    out = run_farm(live, "sync", "--until-caught-up", timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "partial row image of pins" in lines[0], out.stderr
    assert "binlog_row_image=MINIMAL" in lines[0] and "farm migrate" in lines[0]
    run_id = _migrate(live)
    out = run_farm(live, "sync", "--until-caught-up", timeout=120)
    assert out.returncode == 0, out.stderr
    assert ledger.sync_state.read()["run_id"] == run_id


class _StallingQuarantine(Quarantine):
    """The control database's quarantine, its sync writes held at their first statement
    until ``go`` (the zombie's apply, stalled between its legacy read and its record)."""

    def __init__(self, pool) -> None:
        super().__init__(pool)
        self.reached, self.go = threading.Event(), threading.Event()

    def replace(self, *args, **kwargs) -> None:
        self.reached.set()
        assert self.go.wait(120)
        super().replace(*args, **kwargs)


def test_a_zombie_leaders_late_quarantine_is_refused(live, ledger, router,  # noqa: F811
                                                     legacy_server):  # noqa: F811
    """A leader stalls inside an apply after reading a user as bad, before recording it;
    its lease is taken over, the user made valid again and applied by the new leader. The
    zombie's late record used to put the user back in the quarantine (unfenced: nothing
    applies that key again until it changes) while the target holds it; now the record is
    one transaction that the new fence refuses."""
    _forget_position(ledger)
    run = ledger.run(_migrate(live))
    user = _valid_user(legacy_server)
    (name,), = legacy_server.sql(f"SELECT username FROM legacy.users WHERE id = {user}")
    load(legacy_server, [f"UPDATE users SET username = NULL WHERE id = {user}"])
    dsn = DSN.parse(live["FARM_LEGACY_DSN"])
    readers, stalling = sync.Readers(dsn), _StallingQuarantine(ledger.pool)

    def changes() -> sync.Changes:
        out = sync.Changes()  # as the binlog tells it: the username changed
        out.add("users", {"id": user, "username": name}, {"id": user, "username": None})
        return out
    zombie = ledger.sync_state.acquire("zombie", "host-a", 60)
    failed: list[BaseException] = []

    def zombie_apply() -> None:
        try:
            sync.apply(router, FenceToken("sync", 0, zombie), readers, stalling, run, changes())
        except BaseException as exc:  # noqa: BLE001 - looked at below
            failed.append(exc)
    thread = threading.Thread(target=zombie_apply, daemon=True)
    thread.start()
    try:
        assert stalling.reached.wait(120)  # the zombie judged the user bad, and stalls
        load(legacy_server, [f"UPDATE users SET username = '{name}' WHERE id = {user}"])
        ledger.pool.execute("UPDATE sync_state SET expires = NOW(3) - INTERVAL 1 SECOND")
        heir = ledger.sync_state.acquire("heir", "host-b", 60)
        assert heir == zombie + 1
        heirs = sync.Readers(dsn)
        try:
            sync.apply(router, FenceToken("sync", 0, heir), heirs, ledger.quarantine, run,
                       changes())
        finally:
            heirs.close()
    finally:
        stalling.go.set()
        thread.join(120)
        readers.close()
    keys = {(r["legacy_table"], r["legacy_key"]) for r in ledger.quarantine.rows(run["run_id"])}
    assert ("users", str(user)) not in keys, "the zombie's verdict is in the quarantine"
    assert failed and isinstance(failed[0], FencedError), failed
    assert exact(legacy_server, Settings.from_env(live), Path(live["FARM_SHARDMAP"]),
                 run["run_id"]) == []
