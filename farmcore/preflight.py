"""Before a run starts: the shards and mod buckets have their tables, and the control
database exists (``farm shards init`` makes it) with every table of this version (added
last, so a refused command leaves nothing behind).

A run started against a missing shard database would fail chunk by chunk on the workers;
this check refuses it at once, with the command that fixes it.
"""

from __future__ import annotations

from farmcore import control_schema
from shardfarm.errors import ConfigError
from shardfarm.mysql.db import database_exists, ensure_database, where
from shardfarm.mysql.dsn import DSN, Host
from shardfarm.settings import Settings
from sharding.router import Router
from sharding.schema import mod_db, shard_db


def ensure_control(dsn: DSN, create: bool = False) -> None:
    """Create every control table that does not exist yet (a new version's), and with
    ``create`` (``farm shards init``) the control database too. Without it a missing control
    database is a ``ConfigError``: the fleet has its tables, so it was set up with another
    control database, and a run started in a new one (a typo in FARM_CONTROL_DSN) would be
    invisible to every status of the real one."""
    if create:
        ensure_database(dsn)
    elif not database_exists(dsn):
        raise ConfigError(f"the control database {dsn.database} does not exist on "
                          f"{where(dsn, False)}: check FARM_CONTROL_DSN, or run 'farm shards "
                          "init' to create it")
    control_schema.ensure(dsn)


def holds(router: Router, host: Host, db: str, table: str | None = None,
          shard: int | None = None) -> bool:
    """Whether database ``db`` holds any table on ``host`` (or, given, table ``table``: a
    fleet provisioned before mod-bucket writes were fenced lacks ``chunk_fences`` there);
    an error names ``shard`` if given."""
    sql, params = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s", [db]
    if table is not None:
        sql, params = f"{sql} AND table_name = %s", [db, table]
    with router.connection(host, shard) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return bool(cur.fetchone()[0])


def check_fleet(router: Router) -> None:
    """Refuse, changing nothing, when the shard databases are missing: the first and last
    shard of each range of the map must have their tables, and the first bucket of each
    mod range its fences."""
    m = router.shardmap
    for r in m.shard_ranges:
        for shard in {r.lo, r.hi}:
            host = m.master(shard)
            if not holds(router, host, shard_db(shard), shard=shard):
                raise ConfigError(f"shard {shard} has no tables on {host.name}: "
                                  "run 'farm shards init' first")
    for r in m.mod_ranges:
        host = m.mod_master(r.lo)
        if not holds(router, host, mod_db(r.lo), "chunk_fences"):
            raise ConfigError(f"mod bucket {r.lo} has no chunk_fences table on {host.name}: "
                              "run 'farm shards init' (it adds what this version needs)")


def preflight(settings: Settings, router: Router) -> None:
    """Refuse to start when the shard databases or the control database are missing
    (``check_fleet``, ``ensure_control``), then add the control tables this version lacks:
    a command refused here leaves nothing behind."""
    check_fleet(router)
    ensure_control(settings.control_dsn)
