"""A rebalance and an export under fire: workers SIGKILLed, a zombie frozen right before its
export part becomes visible and released after its successor finished. The reader's promise
holds throughout (every follower exactly once), and every exported part is the finalized one,
intact, with the rows the shards hold (counted independently)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import signal
import threading
from pathlib import Path

import pytest

from exporters import export as exporter
from farmcore.ledger import ChunkSpec
from jobs import runs
from jobs.runtime import Runtime
from loaders.mappings import rebalance as rebalancer
from tests.farmkit import children, start_workers, stop, until
from tests.test_export import data  # noqa: F401 - fixture: rows on shards of both servers
from tests.test_hotspot import _all_followers, _reverse, hot_board  # noqa: F401 - fixture

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits

DATE = "2026-11-19"
FROZEN = "tests.kinds.export_frozen"



def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _start_export(rt: Runtime, router, url: str, marker: Path) -> str:
    """An export of ``users`` whose first chunk attempt to reach a part's commit freezes
    itself there (the zombie)."""
    params, chunks = exporter.plan(router, DATE, url, ["users"])
    frozen = [ChunkSpec(c.kind, {**c.args, "freeze_once": str(marker)}) for c in chunks]
    return runs.start(rt, "export", FROZEN, frozen, params)


def _start_rebalance(rt: Runtime, router) -> str:
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 4)
    assert chunks, "the hot board was not found hot"
    return runs.start(rt, "rebalance", rebalancer.HANDLER, chunks, params)


class Reader(threading.Thread):
    """Reads the hot board's followers in a loop; records every broken promise."""

    def __init__(self, router, board: int, expected: set) -> None:
        super().__init__(daemon=True)
        self.router, self.board, self.expected = router, board, expected
        self.stop, self.problems, self.reads = threading.Event(), [], 0

    def run(self) -> None:
        while not self.stop.is_set():
            got = _all_followers(self.router, self.board)
            if len(got) != len(set(got)) or set(got) != self.expected:
                self.problems.append((len(got), len(set(got)), len(self.expected)))
            self.reads += 1


def _unfinished(rt: Runtime, run_id: str) -> list[dict]:
    """The chunks of a run that are not done, for a failure message."""
    return [rt.ledger.chunk(run_id, c) for c in rt.ledger.unfinished(run_id, True)]


def _parts(root: Path) -> dict[str, str]:
    """sha256 of every visible exported file under ``root`` (temp files start with a dot)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _shard_rows(router, table: str) -> int:
    """Rows of ``table`` on every shard, counted with plain SQL (not the exporter's code)."""
    return sum(router.query(router.host_for(s), f"SELECT COUNT(*) FROM `db{s:05d}`.`{table}`",
                            (), s)[0][0] for s in router.shardmap.shards())


def _check_export(root: Path, router) -> None:
    folder = root / "users" / f"dt={DATE}"
    manifest = json.loads((folder / "_manifest.json").read_text())
    assert (folder / "_SUCCESS").exists()
    rows = 0
    for f in manifest["files"]:
        body = (folder / f["path"]).read_bytes()
        assert (len(body), hashlib.sha256(body).hexdigest()) == (f["bytes"], f["sha256"])
        assert len(gzip.decompress(body).splitlines()) == f["rows"]
        rows += f["rows"]
    assert rows == manifest["rows"] == _shard_rows(router, "users")
    assert not [p for p in folder.rglob(".*")]  # no temp file left by anyone


def test_rebalance_and_export_survive_chaos(env, settings, router, hot_board, data,  # noqa: F811
                                            tmp_path):
    board, expected = hot_board
    rt = Runtime(settings)
    _reverse(rt, router, ["board_followedby_users"])
    marker, root = tmp_path / "zombie.pid", tmp_path / "exports"
    export_run = _start_export(rt, router, f"file://{root}", marker)
    reader = Reader(router, board, expected)
    reader.start()
    workers, zombie, rng = start_workers(env, 3), None, random.Random(11)
    try:
        until(lambda: marker.exists() and marker.read_text(), what="a zombie at its commit")
        zombie = int(marker.read_text())
        until(lambda: _stopped(zombie), what="the zombie frozen")
        rebalance_run = _start_rebalance(rt, router)
        others = [p for p in children(workers.pid) if p != zombie]
        os.kill(rng.choice(others), signal.SIGKILL)  # a worker lost in the middle of both runs
        assert runs.wait(rt, export_run, timeout=180) == "done", _unfinished(rt, export_run)
        finalized = _parts(root)
        os.kill(zombie, signal.SIGCONT)  # the zombie wakes right before its rename
        assert runs.wait(rt, rebalance_run, timeout=180) == "done", _unfinished(rt, rebalance_run)
    finally:
        if zombie:
            os.kill(zombie, signal.SIGCONT)
        log = stop(workers)
        reader.stop.set()
        reader.join(timeout=60)
        rt.close()
    assert "taken over" in log
    assert _parts(root) == finalized  # the zombie replaced nothing
    _check_export(root, router)
    assert reader.reads > 0 and reader.problems == []
    got = _all_followers(router, board)
    assert len(got) == len(set(got)) and set(got) == expected
    for run_id in (export_run, rebalance_run):
        assert runs.summary(Runtime(settings), run_id)["failed_chunks"] == 0
