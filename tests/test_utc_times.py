"""A control database written before every session was UTC: its times move to UTC, once."""

from __future__ import annotations

from farmcore import control_schema
from farmcore.ledger import ChunkSpec
from tests.test_ledger import zoned_ledgers  # noqa: F401 - the fixture


def _age_of_old_run(led) -> int:
    (age,), = led.pool.query("SELECT TIMESTAMPDIFF(SECOND, created_at, NOW(3)) FROM runs "
                             "WHERE run_id = 'utctest-old'")
    return age


def test_times_in_the_servers_zone_move_to_utc_once(server_b, zoned_ledgers):  # noqa: F811
    make, zone, dsn = zoned_ledgers
    zone("+05:00")
    raw = server_b.connect(database=dsn.database)  # an earlier version's session: +05:00
    with raw.cursor() as cur:
        cur.execute("DELETE FROM control_clock")  # the database predates this version
        cur.execute("INSERT INTO runs (run_id, kind, queue, params) "
                    "VALUES ('utctest-old', 'utctest', 'q', '{}')")
        cur.execute("INSERT INTO chunks (run_id, chunk_id, kind, args, state, lease_expires, "
                    "started_at) VALUES ('utctest-old', 0, 'k', '{}', 'running', "
                    "NOW(3) + INTERVAL 600 SECOND, NOW(3))")
    raw.close()
    control_schema.ensure(dsn)  # the first of this version
    led = make()
    assert 0 <= _age_of_old_run(led) < 60  # not 5 hours in the future
    assert led.expire_leases() == 0  # the old worker's live lease stays live
    new = led.create_run("utctest", "q", {}, [ChunkSpec("k", {})])
    assert led.latest_run("utctest") == new  # the newest run is the latest
    before = _age_of_old_run(led)
    control_schema.ensure(dsn)  # again, as every run's start does: nothing moves twice
    assert _age_of_old_run(led) - before < 5


def test_a_utc_server_has_nothing_to_move(server_b, zoned_ledgers):  # noqa: F811
    make, zone, dsn = zoned_ledgers
    zone("+00:00")
    raw = server_b.connect(database=dsn.database)
    with raw.cursor() as cur:
        cur.execute("DELETE FROM control_clock")
        cur.execute("INSERT INTO runs (run_id, kind, queue, params, created_at) "
                    "VALUES ('utctest-old', 'utctest', 'q', '{}', UTC_TIMESTAMP(3))")
    raw.close()
    control_schema.ensure(dsn)
    assert 0 <= _age_of_old_run(make()) < 60
