"""An export chunk covers a run of shards: planned per server, one part per shard, and
resumable after a SIGKILL half way through (the parts it recorded are skipped, the rest
written again), with the folder's manifest and ``_SUCCESS`` exact at the end."""

import gzip
import hashlib
import json

from exporters import export as exporter
from exporters import formats
from exporters.destinations import FileDestination
from exporters.partlog import PartLog
from farmcore.context import ChunkContext
from tests import faults
from tests.conftest import SHARDS_A, SHARDS_B
from tests.test_export import DATE, data  # noqa: F401 - fixture

GROUP = 2  # parts a group: a chunk of 8 shards publishes and records 4 groups


def test_plan_runs_shards_per_server_with_at_most_n_each(router, tmp_path):
    params, chunks = exporter.plan(router, DATE, f"file://{tmp_path}", ["users", "pins"],
                                   shards_per_chunk=3)
    a, b = list(range(SHARDS_A[0], SHARDS_A[1] + 1)), list(range(SHARDS_B[0], SHARDS_B[1] + 1))
    runs = [a[0:3], a[3:6], a[6:8], b[0:3], b[3:6], b[6:8]]  # never across the two servers
    assert [c.args for c in chunks] == [{"table": t, "shards": r}
                                        for t in ("users", "pins") for r in runs]
    assert params["parts"] == 16


def _run(ledger, router, run_id: str, chunk_id: int) -> dict:
    lease = ledger.claim(run_id, chunk_id, "test-owner")
    ctx = ChunkContext(None, router, ledger, lease, ledger.run(run_id)["params"])
    out = exporter.export_chunk(ctx, **lease.args)
    ledger.finish(lease, out)
    return out.counts


def _export_parts(ledger, settings, router, tmp_path, name: str) -> tuple[str, FileDestination]:
    dest = FileDestination(tmp_path / name)
    params, chunks = exporter.plan(router, DATE, dest.url, ["users"], shards_per_chunk=8)
    run_id = ledger.create_run("export", "farm", {**params, "handler": exporter.HANDLER},
                               chunks)
    return run_id, dest


def test_a_chunk_killed_half_way_keeps_its_recorded_parts(ledger, settings, router, tmp_path,
                                                          data):  # noqa: F811
    args = {"shardmap": str(router.source.path), "control": str(settings.control_dsn),
            "chunk_id": 0, "group": GROUP}
    clean, _ = _export_parts(ledger, settings, router, tmp_path, "clean")
    trace = faults.steps("export", {**args, "run_id": clean})
    records = [i + 1 for i, line in enumerate(trace) if "INSERT INTO export_parts" in line]
    assert len(records) == 4, trace  # one statement per group of two parts
    run_id, dest = _export_parts(ledger, settings, router, tmp_path, "killed")
    assert faults.run_killed("export", {**args, "run_id": run_id}, records[2]) == -9
    folder = f"users/dt={DATE}/"
    log_ = PartLog(ledger.pool, dest.url)
    shards = list(range(SHARDS_A[0], SHARDS_A[1] + 1))
    assert [p.shard for p in log_.of_run(folder, run_id)] == shards[:4]  # two groups recorded
    visible = [n for n in dest.list(folder)]
    assert visible == [folder + exporter.part_name(s, "jsonl") for s in shards[:6]]
    ledger.pool.execute("UPDATE chunks SET lease_expires = NOW(3) - INTERVAL 1 SECOND "
                        "WHERE run_id = %s", (run_id,))  # the killed worker's lease ran out
    again = _run(ledger, router, run_id, 0)
    assert (again["skipped"], again["written"]) == (4, 4)
    assert not dest.exists(folder + "_SUCCESS")  # the other server's chunk is not done
    _run(ledger, router, run_id, 1)
    manifest = json.loads(dest.read(folder + "_manifest.json"))
    assert [f["shard"] for f in manifest["files"]] == list(router.shardmap.shards())
    for f in manifest["files"]:
        body = dest.read(folder + f["path"])
        assert (len(body), hashlib.sha256(body).hexdigest()) == (f["bytes"], f["sha256"])
        assert len(gzip.decompress(body).splitlines()) == f["rows"]
    assert dest.exists(folder + "_SUCCESS")
    assert not [p for p in (tmp_path / "killed").rglob(".*")]  # no temp file left


def _mapping_rows(router, shard: int, monkeypatch, cap: int) -> list[tuple]:
    from exporters import dump
    monkeypatch.setattr(dump, "GROUP_MAX", cap)
    with dump.snapshot(router.host_for(shard), shard) as conn:
        lines = b"".join(blob for blob, _ in dump.lines(conn, "board_has_pins", shard))
    return [tuple(json.loads(x).values()) for x in lines.splitlines()]


def test_mapping_lines_past_the_servers_cap_are_read_line_by_line(router, data,  # noqa: F811
                                                                  monkeypatch):
    shard = data[0]
    want = router.query(router.host_for(shard), f"SELECT from_id, to_id, sequence FROM "
                        f"`db{shard:05d}`.`board_has_pins` ORDER BY from_id, to_id")
    assert len(want) >= 21
    joined = _mapping_rows(router, shard, monkeypatch, 1 << 20)  # every from ID joined
    assert joined == [tuple(r) for r in want]
    # caps a few bytes apart: some cut a from ID's last line short (its line count still
    # matches); from IDs past the cap come after the rest, so lines are compared as sets
    for cap in range(60, 700, 3):  # past 7 lines (~570 bytes): cut inside the 7th
        got = _mapping_rows(router, shard, monkeypatch, cap)
        assert sorted(got) == joined and len(got) == len(joined), cap


def test_file_destination_refuses_keys_that_leave_its_root(tmp_path):
    import pytest

    from shardfarm.errors import ConfigError
    dest = FileDestination(tmp_path / "root")
    for key in ("../x", "users/../../x", "/etc/passwd", "", "a\0b"):
        with pytest.raises(ConfigError, match="leaves"):
            dest.open_part(key)
    assert dest.sizes("users/dt=x/", ["part-00001.jsonl.gz"]) == {}


def test_an_export_in_another_format_replaces_the_parts(ledger, router, tmp_path,
                                                        data):  # noqa: F811
    """jsonl, then parquet, then jsonl again of one date: each time the folder holds the
    parts of that format alone, as its manifest lists them (a reader takes every file of
    the folder: parts of both formats under one _SUCCESS were every row twice)."""
    dest = FileDestination(tmp_path / "formats")
    folder = f"users/dt={DATE}/"
    for fmt in ("jsonl", "parquet", "jsonl"):
        params, chunks = exporter.plan(router, DATE, dest.url, ["users"], fmt=fmt)
        run_id = ledger.create_run("export", "farm", {**params, "handler": exporter.HANDLER},
                                   chunks)
        for i in range(len(chunks)):
            _run(ledger, router, run_id, i)
        ledger.refresh_status(run_id)
        listed = json.loads(dest.read(folder + exporter.MANIFEST))["files"]
        parts = [k for k in dest.list(folder) if "/part-" in k]
        assert parts == sorted(folder + f["path"] for f in listed) and len(parts) == 16
        assert all(k.endswith(formats.EXTENSIONS[fmt]) for k in parts)
        assert dest.exists(folder + exporter.SUCCESS)
