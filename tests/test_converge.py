"""Re-runs converge: after any change to the legacy database (deletes with every cascade,
rows made invalid or valid again, moves, new usernames and e-mails, a whole new data
set), ``farm migrate`` leaves the target exactly as the independent checker derives
from the current legacy data, and ``farm verify`` passes."""

import json

import pymysql
import pytest
import redis

from tests.conftest import run_farm
from tests.contract_checker import check_migration
from tests.farmkit import start_workers, stop
from tests.migratekit import last_json, quarantine_rows, truncate_target

USERS = 80


def _kw(dsn) -> dict:
    return {"host": dsn.host, "port": dsn.port, "user": dsn.user, "password": dsn.password,
            "database": dsn.database, "autocommit": True}


def _sql(settings, statement: str, args: tuple = ()) -> list[tuple]:
    conn = pymysql.connect(**_kw(settings.legacy_dsn))
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def _migrate_and_check(farm_env, settings, map_path) -> dict:
    out = run_farm(farm_env, "migrate", "--chunk-size", "300", "--wait", timeout=600)
    assert out.returncode == 0, out.stderr + out.stdout + run_farm(farm_env, "failed").stdout
    summary = last_json(out.stdout)
    problems = check_migration(
        {k: v for k, v in _kw(settings.legacy_dsn).items() if k != "autocommit"},
        json.loads(map_path.read_text()),
        quarantine_rows({k: v for k, v in _kw(settings.control_dsn).items()
                         if k != "autocommit"}, summary["run_id"]))
    assert problems == [], "\n".join(problems)
    verify = run_farm(farm_env, "verify", timeout=600)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return summary


@pytest.fixture(scope="module")
def workers(farm_env, settings, router, ledger, server_b):
    redis.Redis.from_url(settings.redis_url).flushdb()
    truncate_target(server_b.port)
    out = run_farm(farm_env, "legacy", "generate", "--users", str(USERS), "--seed", "21",
                   "--replace")
    assert out.returncode == 0, out.stderr
    procs = start_workers({**farm_env, "FARM_LEASE_SECONDS": "10"}, 2)
    yield procs
    stop(procs)


def _user_with_everything(settings) -> int:
    """A valid user owning a board with pins that have comments and likes."""
    return _sql(settings, """
        SELECT u.id FROM users u JOIN boards b ON b.user_id = u.id
        JOIN pins p ON p.board_id = b.id JOIN comments c ON c.pin_id = p.id
        JOIN likes l ON l.pin_id = p.id JOIN follows f ON f.board_id = b.id
        WHERE u.username IS NOT NULL AND u.created_at IS NOT NULL AND u.id < (1 << 35)
        ORDER BY u.id LIMIT 1""")[0][0]


def _saved(settings, user: int) -> dict[str, list[tuple]]:
    """The user's row (to put back later) and its pins (which stay in legacy as orphans)."""
    boards = "(SELECT id FROM boards WHERE user_id = %s)"
    return {"users": _sql(settings, "SELECT * FROM users WHERE id = %s", (user,)),
            "pins": _sql(settings, f"SELECT * FROM pins WHERE board_id IN {boards}", (user,))}


def _put_back(settings, saved: dict[str, list[tuple]]) -> None:
    for table, rows in saved.items():
        for row in rows:
            _sql(settings, f"INSERT INTO {table} VALUES ({','.join(['%s'] * len(row))})", row)


def _new_id(router, type_id: int, legacy: int) -> int | None:
    from sharding.ids import TYPE_NAMES
    from sharding.modshard import bucket_of, legacy_key
    from sharding.schema import mod_table
    b = bucket_of(legacy_key(TYPE_NAMES[type_id], legacy), router.shardmap.buckets)
    rows = router.run_mod(b, lambda cur: (cur.execute(
        f"SELECT new_id FROM {mod_table(b, 'legacy_id_map')} WHERE type_id = %s AND "
        "legacy_id = %s", (type_id, legacy)), cur.fetchall())[1])
    return rows[0][0] if rows else None


def _mutate(settings) -> None:
    """Every kind of change but the cascading delete (done by the test itself)."""
    valid = [r[0] for r in _sql(settings, "SELECT id FROM users WHERE username IS NOT NULL "
                                "AND created_at IS NOT NULL ORDER BY id")]
    a, b, c, d = valid[-1], valid[-2], valid[-3], valid[-4]
    _sql(settings, "UPDATE users SET created_at = NULL WHERE id = %s", (a,))  # now invalid
    _sql(settings, "UPDATE users SET username = CONCAT('Reborn', id) WHERE username IS NULL")
    _sql(settings, "UPDATE users SET username = CONCAT('Renamed', id), email = %s "
                   "WHERE id = %s", ("Shared@Example.com", b))
    _sql(settings, "UPDATE users SET email = %s WHERE id = %s", ("shared@example.COM", c))
    _sql(settings, "UPDATE boards SET user_id = %s WHERE user_id = %s", (d, c))  # moved
    _sql(settings, "DELETE FROM follows ORDER BY user_id DESC LIMIT 5")
    _sql(settings, "DELETE FROM boards ORDER BY id DESC LIMIT 1")  # its pins: orphans
    _sql(settings, "UPDATE pins SET created_at = '2015-01-02 03:04:05' "
                   "WHERE created_at IS NULL OR created_at < '1000-01-01'")
    _sql(settings, "INSERT INTO pins (id, user_id, board_id, details, link, image_url, "
                   "created_at) SELECT MAX(id) + 1, %s, (SELECT MIN(id) FROM boards WHERE "
                   "user_id = %s), 'new', NULL, NULL, '2016-01-01 00:00:00' FROM pins", (d, d))


@pytest.mark.slow
def test_rerun_converges_after_every_kind_of_change(workers, farm_env, settings, router,
                                                    map_path):
    _migrate_and_check(farm_env, settings, map_path)
    user = _user_with_everything(settings)
    before = _new_id(router, 3, user)
    saved = _saved(settings, user)
    pins = {r[0]: _new_id(router, 1, r[0]) for r in saved["pins"]}
    _sql(settings, "DELETE FROM users WHERE id = %s", (user,))  # cascades in the target
    _mutate(settings)
    _migrate_and_check(farm_env, settings, map_path)
    assert _new_id(router, 3, user) is None
    _put_back(settings, {"users": saved["users"]})  # brings its boards and pins back
    _migrate_and_check(farm_env, settings, map_path)
    assert _new_id(router, 3, user) == before
    assert {p: _new_id(router, 1, p) for p in pins} == pins


@pytest.mark.slow
def test_rerun_converges_on_a_different_data_set(workers, farm_env, settings, map_path):
    _migrate_and_check(farm_env, settings, map_path)
    out = run_farm(farm_env, "legacy", "generate", "--users", str(USERS), "--seed", "22",
                   "--replace")
    assert out.returncode == 0, out.stderr
    _migrate_and_check(farm_env, settings, map_path)
