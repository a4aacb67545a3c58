"""``farm export`` with real workers into a real S3 API (moto's server over HTTP) and a directory;
the export is read back by real consumers (DuckDB, pyarrow) and compared with plain SQL."""

import gzip
import hashlib
import json
import os
import subprocess
import sys

import boto3
import duckdb
import pymysql
import pytest
import redis
from fsspec.implementations.arrow import ArrowFSWrapper
from moto.server import ThreadedMotoServer
from pyarrow import dataset as pads
from pyarrow import fs as pafs

from exporters import export as exporter
from exporters.destinations import FileDestination, open_destination
from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Outcome
from sharding import ids
from sharding.schema import OBJECT_TABLES, shard_ddl
from tests.conftest import ROOT, SHARDS_A, SHARDS_B, run_farm
from tests.farmkit import start_workers, stop
from tests.servers import free_port

BUCKET = "farm-export"
DATE = "2026-11-21"
TABLES = ("users", "pins", "board_has_pins")
BASE = 800_000_000
DOCS = [{"username": "zoë", "n": 1, "tags": ["a", "b"], "nested": {"x": None, "y": 1.5}},
        {"username": "名前", "quote": "say \"hi\"\n\tbye", "n": 2},
        {"username": "emoji 🎉", "n": 3, "empty": {}}]
RAW_NEWLINE_DOC = '{"username": "pretty",\n  "n": 4}'  # valid JSON with a raw line break
RAW_CR_DOC = '{"username": "old mac",\r  "n": 5}'  # a lone CR: a line end to many readers


# -- services -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3():
    """moto's S3 API server on a free port, a versioned bucket, and the AWS_* environment."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    yield {"env": aws, "client": client, "port": port}
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def env(farm_env, ledger, s3):
    e = {**farm_env, **s3["env"], "FARM_EXPORT_URL": f"s3://{BUCKET}/nightly"}
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()
    yield e
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()


@pytest.fixture
def workers(env, data):
    proc = start_workers(env, 2)
    yield proc
    stop(proc)


def _exec(router, shard: int, sql: str, params=()) -> None:
    router.run(shard, lambda cur: cur.execute(sql, params))


@pytest.fixture(scope="module")
def data(router):
    """Object and mapping rows on shards of both servers (local IDs >= 800M), removed after."""
    shards = [SHARDS_A[0], SHARDS_A[0] + 3, SHARDS_B[0] + 1, SHARDS_B[1]]
    for i, s in enumerate(shards):
        for t, table in enumerate(("users", "pins")):
            rows = [(BASE + i * 100 + k, json.dumps({**DOCS[k % 3], "shard": s, "k": k},
                                                    ensure_ascii=False), int(k % 4 != 3))
                    for k in range(10 + 5 * t)]
            router.run(s, lambda cur, s=s, table=table, rows=rows: cur.executemany(
                f"INSERT INTO `db{s:05d}`.`{table}` (local_id, data, active) VALUES (%s,%s,%s)",
                rows))
        _exec(router, s, f"INSERT INTO `db{s:05d}`.`users` (local_id, data) VALUES (%s, %s)",
              (BASE + i * 100 + 99, RAW_CR_DOC if i % 2 else RAW_NEWLINE_DOC))
        boards = [ids.encode(s, "board", BASE + k) for k in range(3)]
        edges = [(b, ids.encode(shards[-1 - i], "pin", BASE + k), 1_700_000_000 + k)
                 for b in boards for k in range(7)]
        router.run(s, lambda cur, s=s, edges=edges: cur.executemany(
            f"INSERT INTO `db{s:05d}`.`board_has_pins` (from_id, to_id, sequence) "
            "VALUES (%s,%s,%s)", edges))
    yield shards
    for s in shards:
        for table in ("users", "pins"):
            _exec(router, s, f"DELETE FROM `db{s:05d}`.`{table}` WHERE local_id >= %s", (BASE,))
        _exec(router, s, f"DELETE FROM `db{s:05d}`.`board_has_pins` WHERE from_id IN "
              f"({','.join(str(ids.encode(s, 'board', BASE + k)) for k in range(3))})")


# -- what the shards hold, by plain SQL -----------------------------------------------------
def expected(router, table: str, host_role: str = "master") -> list[tuple]:
    out = []
    for s in router.shardmap.shards():
        host = router.host_for(s, host_role)
        if table in OBJECT_TABLES:
            for local, data, active in router.query(
                    host, f"SELECT local_id, data, active FROM `db{s:05d}`.`{table}`"):
                out.append((ids.encode(s, OBJECT_TABLES[table], local), s, local, bool(active),
                            json.loads(data)))
        else:
            out += [tuple(r) for r in router.query(
                host, f"SELECT from_id, to_id, sequence FROM `db{s:05d}`.`{table}`")]
    return sorted(out, key=lambda r: r[:3])


def duck_rows(con, glob: str, table: str) -> list[tuple]:
    """A Spark-style read: every part under {table}/dt=*/, Hive partitioning, via DuckDB."""
    if table in OBJECT_TABLES:
        cols = ("{'id': 'UBIGINT', 'shard': 'INTEGER', 'local_id': 'UBIGINT', "
                "'active': 'BOOLEAN', 'data': 'JSON'}")
        rows = con.sql(f"SELECT id, shard, local_id, active, data, dt FROM read_json('{glob}', "
                       f"format='newline_delimited', hive_partitioning=true, columns={cols})"
                       ).fetchall()
        assert {str(r[5]) for r in rows} <= {DATE}
        return sorted(((i, s, loc, a, json.loads(d)) for i, s, loc, a, d, _ in rows),
                      key=lambda r: r[:3])
    cols = "{'from_id': 'UBIGINT', 'to_id': 'UBIGINT', 'sequence': 'BIGINT'}"
    rows = con.sql(f"SELECT from_id, to_id, sequence, dt FROM read_json('{glob}', "
                   f"format='newline_delimited', hive_partitioning=true, columns={cols})"
                   ).fetchall()
    assert {str(r[3]) for r in rows} <= {DATE}
    return sorted(tuple(r[:3]) for r in rows)


def s3_duckdb(s3) -> duckdb.DuckDBPyConnection:
    """DuckDB reading s3:// through pyarrow's own S3 client (not boto3) pointed at moto."""
    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{s3['port']}", scheme="http",
                           access_key="testing", secret_key="testing", region="us-east-1")
    con = duckdb.connect()
    con.register_filesystem(ArrowFSWrapper(fs))
    return con


def summary(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout.strip().splitlines()[-1])


def versions(client, prefix: str) -> dict[str, list[dict]]:
    """Every version and delete marker under ``prefix``, by key."""
    out: dict[str, list[dict]] = {}
    resp = client.list_object_versions(Bucket=BUCKET, Prefix=prefix)
    for v in resp.get("Versions", []) + resp.get("DeleteMarkers", []):
        out.setdefault(v["Key"], []).append(v)
    return out


# -- S3 -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_export_to_s3_is_read_back_exactly(env, workers, router, s3):
    doc = summary(run_farm(env, "export", "--date", DATE, "--tables", ",".join(TABLES),
                           "--wait", timeout=120))
    assert doc["status"] == "done" and doc["failed_chunks"] == 0
    con, client = s3_duckdb(s3), s3["client"]
    for table in TABLES:
        want = expected(router, table)
        assert doc["loaded"][table] == len(want)
        got = duck_rows(con, f"s3://{BUCKET}/nightly/{table}/*/*.jsonl.gz", table)
        assert got == want, table
        folder = f"nightly/{table}/dt={DATE}/"
        manifest = json.loads(client.get_object(Bucket=BUCKET, Key=folder + "_manifest.json")
                              ["Body"].read())
        shards = list(router.shardmap.shards())
        assert [f["shard"] for f in manifest["files"]] == shards
        assert manifest["rows"] == len(want) and manifest["table"] == table
        for f in manifest["files"]:
            body = client.get_object(Bucket=BUCKET, Key=folder + f["path"])["Body"].read()
            assert (len(body), hashlib.sha256(body).hexdigest()) == (f["bytes"], f["sha256"])
            assert len(gzip.decompress(body).splitlines()) == f["rows"]
        heads = {k: client.head_object(Bucket=BUCKET, Key=folder + k)["LastModified"]
                 for k in ("_manifest.json", "_SUCCESS")}
        assert heads["_SUCCESS"] >= heads["_manifest.json"]
    mine = [r for r in expected(router, "users") if BASE <= r[2] < BASE + 1000]
    assert len(mine) == 4 * 11 and {"username": "pretty", "n": 4} in [r[4] for r in mine]
    assert {"username": "old mac", "n": 5} in [r[4] for r in mine]
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


@pytest.mark.slow
def test_reexport_uploads_nothing_and_force_rewrites(env, workers, router, s3):
    client = s3["client"]
    before = versions(client, "nightly/")
    assert before and [k for k, v in before.items() if len(v) != 1] == []  # one version each
    doc = summary(run_farm(env, "export", "--date", DATE, "--tables", ",".join(TABLES),
                           "--wait", timeout=120))
    assert doc["status"] == "done" and set(doc["loaded"].values()) == {0}
    shards = len(list(router.shardmap.shards()))
    assert doc["skipped"] == dict.fromkeys(TABLES, shards)  # every part unchanged, skipped
    assert versions(client, "nightly/") == before  # not one PUT, delete or upload
    doc = summary(run_farm(env, "export", "--date", DATE, "--tables", "users", "--force",
                           "--wait", timeout=120))
    assert doc["loaded"]["users"] == len(expected(router, "users"))
    after = versions(client, f"nightly/users/dt={DATE}/")
    parts = {k: v for k, v in after.items() if "/part-" in k}
    assert len(parts) == 16 and all(len(v) == 2 for v in parts.values())
    success = client.head_object(Bucket=BUCKET, Key=f"nightly/users/dt={DATE}/_SUCCESS")
    newest_part = max(v["LastModified"] for vs in parts.values() for v in vs)
    assert success["LastModified"] >= newest_part
    assert versions(client, f"nightly/pins/dt={DATE}/") == {
        k: v for k, v in before.items() if k.startswith(f"nightly/pins/dt={DATE}/")}
    con = s3_duckdb(s3)
    assert duck_rows(con, f"s3://{BUCKET}/nightly/users/*/*.jsonl.gz", "users") == \
        expected(router, "users")


def test_changed_part_withdraws_success_until_final(router, ledger, s3, data):
    """Re-exporting after a change rewrites the part; _SUCCESS is off while it changes."""
    dest = open_destination(f"s3://{BUCKET}/unit")
    params = {"kinds": ["users"], "date": DATE, "dest": dest.url, "format": "jsonl",
              "from": "master", "force": False, "handler": exporter.HANDLER}
    shards = [SHARDS_A[0], SHARDS_A[0] + 1]

    def start(p: dict) -> str:
        return ledger.create_run("export", "farm", p, [
            ChunkSpec("users", {"table": "users", "shard": s}) for s in shards])

    def chunk(run_id: str, i: int, p: dict) -> Outcome:
        lease = ledger.claim(run_id, i, "test-owner")
        out = exporter.export_chunk(ChunkContext(None, router, ledger, lease, p), "users",
                                  shards[i])
        ledger.finish(lease, out)
        ledger.refresh_status(run_id)  # as a worker does: a finished run lets the next write
        return out

    folder = f"users/dt={DATE}/"
    run = start(params)
    assert not chunk(run, 0, params).counts["skipped"]
    assert not dest.exists(folder + "_SUCCESS") and not dest.exists(folder + "_manifest.json")
    chunk(run, 1, params)
    assert dest.exists(folder + "_SUCCESS")
    first = json.loads(dest.read(folder + "_manifest.json"))
    _exec(router, shards[0], f"UPDATE `db{shards[0]:05d}`.`users` SET data = "
          "JSON_SET(data, '$.changed', 1) WHERE local_id = %s", (BASE,))
    forced = {**params, "force": True}
    run2 = start(forced)
    chunk(run2, 0, forced)
    assert not dest.exists(folder + "_SUCCESS")  # a part changed: no success marker yet
    chunk(run2, 1, forced)
    second = json.loads(dest.read(folder + "_manifest.json"))
    assert dest.exists(folder + "_SUCCESS")
    assert second["files"][0]["sha256"] != first["files"][0]["sha256"]
    assert second["files"][1] == first["files"][1]
    run3 = start(params)  # not forced: both parts intact, nothing written, counts carried over
    outs = [chunk(run3, i, params) for i in range(2)]
    assert [(o.counts["skipped"], o.counts["written"]) for o in outs] == [(1, 0), (1, 0)]
    assert json.loads(dest.read(folder + "_manifest.json")) == second


def test_a_part_written_again_drops_what_a_killed_writer_left(router, data, tmp_path):
    """A writer SIGKILLed mid-part leaves its temp file; the next attempt at that part
    removes it (and only temp files of that part; a manifest's writers are left alone)."""
    shard = data[0]
    folder = tmp_path / "users" / "dt=x"
    folder.mkdir(parents=True)
    name = f"part-{shard:05d}.jsonl.gz"
    dead = folder / f".{name}.tmp-4242-abcdef"
    others = [folder / f".part-{shard + 1:05d}.jsonl.gz.tmp-4242-abcdef",
              folder / "._manifest.json.tmp-4242-abcdef"]
    for f in (dead, *others):
        f.write_bytes(b"half")
    dest = FileDestination(tmp_path)
    part = exporter.dump_part(router.host_for(shard), shard, "users", "jsonl", dest,
                              f"users/dt=x/{name}")
    assert not dead.exists() and all(f.exists() for f in others)
    assert part.rows == len(gzip.decompress(dest.read(f"users/dt=x/{name}")).splitlines())


# -- file://, Parquet, --from slave ---------------------------------------------------------
@pytest.mark.slow
def test_file_export_read_by_duckdb_and_parquet_by_pyarrow(env, workers, router, tmp_path):
    url = f"file://{tmp_path}/exp"
    doc = summary(run_farm(env, "export", "--date", DATE, "--dest", url, "--tables",
                           "users,board_has_pins", "--wait", timeout=120))
    assert doc["status"] == "done"
    con = duckdb.connect()
    for table in ("users", "board_has_pins"):
        got = duck_rows(con, f"{tmp_path}/exp/{table}/*/*.jsonl.gz", table)
        assert got == expected(router, table)
        assert (tmp_path / "exp" / table / f"dt={DATE}" / "_SUCCESS").exists()
    assert not [p for p in (tmp_path / "exp").rglob(".*")]  # no temp files left behind
    doc = summary(run_farm(env, "export", "--date", DATE, "--dest", url, "--tables",
                           "pins", "--format", "parquet", "--wait", timeout=120))
    assert doc["status"] == "done"
    table = pads.dataset(str(tmp_path / "exp" / "pins"), format="parquet",
                         partitioning="hive").to_table()
    assert set(table.column("dt").to_pylist()) == {DATE}
    got = sorted(((r["id"], r["shard"], r["local_id"], r["active"], json.loads(r["data"]))
                  for r in table.to_pylist()), key=lambda r: r[:3])
    assert got == expected(router, "pins")


def test_parquet_without_pyarrow_is_one_clear_line(env):
    code = ("import sys; sys.modules['pyarrow'] = None; from scripts import cli; "
            "cli.main(sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", code, "export", "--date", DATE, "--format",
                          "parquet"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "farm: error: --format parquet needs pyarrow: pip install 'shardfarm[parquet]'"]


def test_bad_date_and_table_are_refused(env):
    """Usage mistakes exit 2 with one line (1 is for everything else)."""
    out = run_farm(env, "export", "--date", "2026-13-01")
    assert out.returncode == 2 and "bad export date" in out.stderr
    assert out.stderr.count("\n") == 1
    out = run_farm(env, "export", "--date", DATE, "--tables", "users,nope")
    assert out.returncode == 2 and "cannot export nope" in out.stderr
    assert out.stderr.count("\n") == 1


@pytest.fixture
def slave_map(server_b, router, tmp_path):
    """Shards 65024-65025 whose master is the shared server and whose slave is server B,
    where the slave's copy holds different rows."""
    shards = (SHARDS_A[0], SHARDS_A[0] + 1)
    a = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    b = {"host": "127.0.0.1", "port": server_b.port, "user": "root", "password": ""}
    doc = {"version": 1, "hosts": {"M": a, "S": b},
           "shards": [{"range": list(shards), "master": "M", "slave": "S"}],
           "open": [list(shards)],
           "mod": {"buckets": 64, "ranges": [{"range": [0, 63], "master": "S", "slave": "S"}]}}
    path = tmp_path / "slave-map.json"
    path.write_text(json.dumps(doc))
    conn = pymysql.connect(host="127.0.0.1", port=server_b.port, user="root", autocommit=True,
                           charset="utf8mb4")
    with conn.cursor() as cur:
        for s in shards:
            for sql in shard_ddl(s):
                cur.execute(sql)
            cur.execute(f"DELETE FROM `db{s:05d}`.users")
            cur.executemany(f"INSERT INTO `db{s:05d}`.users (local_id, data) VALUES (%s, %s)",
                            [(7_000 + k, json.dumps({"on": "slave", "k": k})) for k in range(5)])
    yield path, shards
    with conn.cursor() as cur:
        for s in shards:
            cur.execute(f"DROP DATABASE IF EXISTS `db{s:05d}`")
    conn.close()


@pytest.mark.slow
def test_from_slave_reads_the_slave(env, slave_map, tmp_path):
    path, shards = slave_map
    e = {**env, "FARM_SHARDMAP": str(path)}
    url = f"file://{tmp_path}/slave"
    doc = summary(run_farm(e, "export", "--date", DATE, "--dest", url, "--tables", "users",
                           "--from", "slave"))
    start_workers(e, 1, "--burst").wait(timeout=60)
    con = duckdb.connect()
    got = duck_rows(con, f"{tmp_path}/slave/users/*/*.jsonl.gz", "users")
    assert [r[4] for r in got] == [{"on": "slave", "k": k} for k in range(5)] * 2
    assert {r[1] for r in got} == set(shards)
    assert doc["run_id"].startswith("export-")


# -- read-ahead -----------------------------------------------------------------------------
