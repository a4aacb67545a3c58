"""Helpers for migration tests: clean target, table checksums, checker inputs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

import pymysql
import pytest
import redis

from jobs import lifecycle
from loaders.migration import writer
from sharding.schema import (
    MAPPING_TABLES,
    MOD_FARM_TABLES,
    MOD_TABLES,
    OBJECT_TABLES,
    mod_db,
    shard_db,
)
from tests.conftest import SHARDS_A, SHARDS_B, TEST_BUCKETS, run_farm

TARGET_SHARD_TABLES = [*OBJECT_TABLES, *MAPPING_TABLES, "board_followedby_user_shard",
                       "chunk_fences"]


def _servers(port_b: int) -> dict[int, list[str]]:
    """Qualified tables of the test map per server port."""
    out: dict[int, list[str]] = {3306: [], port_b: []}
    for lo, hi, port in ((*SHARDS_A, 3306), (*SHARDS_B, port_b)):
        for s in range(lo, hi + 1):
            out[port] += [f"`{shard_db(s)}`.`{t}`" for t in TARGET_SHARD_TABLES]
    out[port_b] += [f"`{mod_db(b)}`.`{t}`" for b in range(TEST_BUCKETS)
                    for t in [*MOD_TABLES, *MOD_FARM_TABLES]]
    return out


def generate_legacy(farm_env: dict, settings, port_b: int, users: int, seed: int) -> None:
    """Redis emptied, the target emptied, a legacy database of ``users`` generated."""
    redis.Redis.from_url(settings.redis_url).flushdb()
    truncate_target(port_b)
    out = run_farm(farm_env, "legacy", "generate", "--users", str(users), "--seed", str(seed),
                   "--replace")
    assert out.returncode == 0, out.stderr


def dsn_kwargs(dsn) -> dict:
    """``pymysql.connect`` arguments of a DSN."""
    return {"host": dsn.host, "port": dsn.port, "user": dsn.user, "password": dsn.password,
            "database": dsn.database}


def users_named(router, b: int, key: str) -> list[int]:
    """The user IDs ``username_to_user`` of mod bucket ``b`` gives for ``key``."""
    return [int(r[0]) for r in router.run_mod(b, lambda cur: (cur.execute(
        f"SELECT user_id FROM `{mod_db(b)}`.`username_to_user` WHERE username = %s", (key,)),
        cur.fetchall())[1])]


def truncate_target(port_b: int) -> None:
    """Empty every shard and mod table of the test map."""
    for port, tables in _servers(port_b).items():
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
        with conn.cursor() as cur:
            for t in tables:
                cur.execute(f"TRUNCATE TABLE {t}")
        conn.close()


def checksums(port_b: int, skip: tuple[str, ...] = ("chunk_fences",)) -> dict[str, int]:
    """``CHECKSUM TABLE`` of every target table (content, not timestamps)."""
    out = {}
    for port, tables in _servers(port_b).items():
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root")
        with conn.cursor() as cur:
            wanted = [t for t in tables if not t.endswith(tuple(f"`{s}`" for s in skip))]
            for i in range(0, len(wanted), 200):
                cur.execute("CHECKSUM TABLE " + ", ".join(wanted[i:i + 200]))
                out.update({name: value for name, value in cur.fetchall()})
        conn.close()
    return out


def quarantine_rows(control: dict, run_id: str) -> list[tuple[str, str, str]]:
    """The quarantine of a run as the independent checker wants it."""
    conn = pymysql.connect(**control)
    with conn.cursor() as cur:
        cur.execute("SELECT legacy_table, legacy_key, reason FROM quarantine WHERE run_id = %s",
                    (run_id,))
        rows = list(cur.fetchall())
    conn.close()
    return rows


def last_json(stdout: str) -> dict:
    """The JSON summary a ``--wait`` command prints last."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_inline(rt, run_id: str, chunks: Iterable[int]) -> list[str]:
    """Execute ``chunks`` of run ``run_id`` in this process, in order, as a worker does;
    what ``lifecycle.execute`` returned for each."""
    return [lifecycle.execute(rt, run_id, c) for c in chunks]


def killed(rt, run_id: str, chunk: int, killer: Callable, monkeypatch) -> None:
    """Run ``chunk`` with ``writer.write_shards`` replaced by ``killer(real)``, which raises
    ``KeyboardInterrupt`` (not an Exception: like SIGKILL, nothing is recorded), then let
    the dead attempt's lease expire."""
    real = writer.write_shards
    monkeypatch.setenv("FARM_LEASE_SECONDS", "1")
    monkeypatch.setattr(writer, "write_shards", killer(real))
    with pytest.raises(KeyboardInterrupt):
        lifecycle.execute(rt, run_id, chunk)
    monkeypatch.setattr(writer, "write_shards", real)
    time.sleep(1.2)


def die_at_second_slice(written: list, real: Callable) -> Callable:
    """A ``write_shards`` that writes the first slice's rows (kept in ``written``) and is
    killed at the second."""
    def write(router, token, rows, **kw):
        if written:
            raise KeyboardInterrupt("worker killed")
        real(router, token, rows, **kw)
        written.append(rows)
    return write
