"""``farm demo`` end to end on a private mariadbd of its own: the whole story runs, reports,
runs again, and ``--clean`` removes what it made (and nothing else of the destination)."""

import json

import pymysql
import pytest
import redis

from tests.conftest import DEMO_REDIS_DB, run_farm
from tests.servers import PrivateMariaDB

REDIS_URL = f"redis://127.0.0.1:6379/{DEMO_REDIS_DB}"


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory):
    """A four-shard, 64-bucket map on a private server; control, legacy and Redis of its own."""
    server = PrivateMariaDB.start()
    root = tmp_path_factory.mktemp("demo")
    h = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""}
    doc = {"version": 1, "hosts": {"C1": h},
           "shards": [{"range": [0, 3], "master": "C1", "slave": "C1"}], "open": [[0, 3]],
           "mod": {"buckets": 64, "ranges": [{"range": [0, 63], "master": "C1",
                                              "slave": "C1"}]}}
    (root / "map.json").write_text(json.dumps(doc))
    dsn = f"mysql://root@127.0.0.1:{server.port}"
    env = {"FARM_SHARDMAP": str(root / "map.json"), "FARM_CONTROL_DSN": f"{dsn}/farm_control",
           "FARM_LEGACY_DSN": f"{dsn}/legacy", "FARM_REDIS_URL": REDIS_URL,
           "FARM_EXPORT_URL": f"file://{root}/exports"}
    redis.Redis.from_url(REDIS_URL).flushdb()
    yield env, server, root
    redis.Redis.from_url(REDIS_URL).flushdb()
    server.stop()


def _databases(port: int) -> set[str]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root")
    with conn.cursor() as cur:
        cur.execute("SHOW DATABASES")
        names = {r[0] for r in cur.fetchall()}
    conn.close()
    return names - {"mysql", "information_schema", "performance_schema", "sys"}


def test_demo_runs_twice_and_cleans_up(farm_env, demo_env):
    env, server, root = demo_env
    env = {**farm_env, **env}
    keep = root / "exports" / "someone-elses" / "data.txt"  # not the demo's: must survive
    keep.parent.mkdir(parents=True)
    keep.write_text("keep me")
    for _ in range(2):
        out = run_farm(env, "demo", "--users", "150", timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        report = out.stdout
        assert ": done, 0 failed chunks" in report and "0 mismatches" in report
        for phase in ("migrate", "verify", "reverse mappings", "home feeds", "export"):
            assert f"  {phase} " in report, phase
        assert "quarantined rows by reason:" in report and "board page:" in report
        parts = [line for line in report.splitlines() if "/dt=" in line and "parts" in line]
        assert len(parts) == 13 and all(line.endswith("_SUCCESS") for line in parts)
    assert {"farm_control", "legacy", "db00000", "mod00063"} <= _databases(server.port)
    out = run_farm(env, "demo", "--clean")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["export_files_deleted"] == 13 * (4 + 2)
    assert _databases(server.port) == set()
    assert keep.read_text() == "keep me"
    assert [p.name for p in (root / "exports").iterdir()] == ["someone-elses"]
    assert not redis.Redis.from_url(REDIS_URL).keys("rq:*")
