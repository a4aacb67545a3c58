"""A zombie migration chunk: what it writes after its successor took over is refused."""

import pymysql
import pytest

from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from loaders.migration import writer
from loaders.migration.verdicts import Verdicts
from shardfarm.errors import FencedError
from sharding.fencing import FenceToken
from sharding.ids import MAX_LOCAL
from sharding.modshard import bucket_of
from tests.migratekit import dsn_kwargs, generate_legacy, truncate_target, users_named


@pytest.fixture(scope="module")
def legacy_users(farm_env, settings, server_b, router, ledger):
    """A generated legacy database, the test map's and the control databases created
    (``router``, ``ledger``), the target emptied before and after."""
    generate_legacy(farm_env, settings, server_b.port, 250, 11)
    yield
    truncate_target(server_b.port)


@pytest.mark.slow
def test_a_zombie_chunks_late_lookups_are_refused_after_its_successor_renamed_a_user(
        legacy_users, settings, server_b, monkeypatch):
    """A users chunk of several slices stalls after its mapping rows, right before its
    lookups; a user of it is renamed in the legacy data and a successor (a higher fence)
    loads the chunk to its end. The zombie's lookups, naming the user by its old name, are
    refused by the mod bucket's fence: the old name names no one, the new one the user."""
    rt = Runtime(settings.with_(redis_url=settings.redis_url))
    legacy = pymysql.connect(**dsn_kwargs(settings.legacy_dsn), autocommit=True)
    renamed: list = []
    try:
        truncate_target(server_b.port)
        params, chunks = migration.plan(settings, rt.router, rt.ledger, 250, 100)
        users = next(c for c in chunks if c.kind == "users" and len(c.args.get("slices", [])) > 1)
        sels = migration.selections(users.args["lo"], users.args["hi"], users.args["slices"])
        zombie, heir = FenceToken("t-zombie", 0, 1), FenceToken("t-zombie", 0, 2)

        def state():
            return migration.ProcessState(migration.LegacyReader(settings.legacy_dsn), {},
                                          Verdicts())
        real = writer.write_mod

        def stall(router, rows, token=None):  # the zombie, at its chunk-end lookups
            names = [r for (_, n), rs in sorted(rows.lookups.items()) if n == "username_to_user"
                     for r in rs if r[1] & MAX_LOCAL < 1 << 35]  # local ID = legacy ID
            if token == zombie and names and not renamed:
                renamed.append(_rename(legacy, names[0][0], names[0][1] & MAX_LOCAL))
                migration.load_slices(router, heir, state(), params, "users", sels,
                                      lambda bad: None)
            return real(router, rows, token)
        monkeypatch.setattr(writer, "write_mod", stall)
        with pytest.raises(FencedError, match="fence 1 < 2"):
            migration.load_slices(rt.router, zombie, state(), params, "users", sels,
                                  lambda bad: None)
        old, new, user = renamed[0]
        assert _users_named(rt.router, old) == []
        assert [u & MAX_LOCAL for u in _users_named(rt.router, new)] == [user]
    finally:
        if renamed:
            with legacy.cursor() as cur:
                cur.execute("UPDATE users SET username = %s WHERE id = %s",
                            (renamed[0][0], renamed[0][2]))
        truncate_target(server_b.port)
        legacy.close()
        rt.close()


def _rename(legacy, key: str, user: int) -> tuple[str, str, int]:
    """Rename legacy user ``user`` (whose username is ``key`` in lower case): ``(old
    username, new, user)``."""
    with legacy.cursor() as cur:
        cur.execute("SELECT username FROM users WHERE id = %s", (user,))
        (old,) = cur.fetchone()
        assert old.lower() == key
        cur.execute("UPDATE users SET username = %s WHERE id = %s", (old + "-renamed", user))
    return old, old + "-renamed", user


def _users_named(router, username: str) -> list[int]:
    """``username_to_user`` entries of ``username`` (in its bucket)."""
    key = username.lower()
    return users_named(router, bucket_of(key, router.shardmap.buckets), key)
