"""The ledger's reports: progress per chunk kind, failed chunks, per-chunk counts."""

from farmcore.ledger import ChunkSpec, Outcome


def test_progress_failures_and_counts_follow_the_chunks(ledger):
    specs = [ChunkSpec("pins", {"i": 0}, rows=10), ChunkSpec("pins", {"i": 1}, rows=5),
             ChunkSpec("users", {"i": 2}), ChunkSpec("users", {"i": 3})]
    run = ledger.create_run("test", "q", {}, specs)
    other = ledger.create_run("test", "q", {}, [ChunkSpec("users", {"i": 9})])
    done = ledger.claim(run, 0, "w1")
    ledger.finish(done, Outcome(rows_read=10, rows_written=8, rows_quarantined=2,
                                counts={"pins": 8}))
    ledger.claim(run, 1, "w1")  # left running
    failed = ledger.fail(ledger.claim(run, 2, "w2"), "boom: shard 7 refused", None)
    ledger.fail(ledger.claim(other, 0, "w2"), "another run's failure", None)

    by_kind = {k["kind"]: k for k in ledger.progress(run)}
    assert [k["kind"] for k in ledger.progress(run)] == ["pins", "users"]  # first chunk first
    pins, users = by_kind["pins"], by_kind["users"]
    assert (pins["total"], pins["done"], pins["running"], pins["pending"]) == (2, 1, 1, 0)
    assert (pins["rows_read"], pins["rows_written"], pins["rows_quarantined"]) == (10, 8, 2)
    assert pins["busy_seconds"] >= 0 and pins["first_start"] is not None
    assert (users["total"], users["failed"], users["pending"], users["done"]) == (2, 1, 1, 0)
    assert users["rows_read"] == 0 and users["last_finish"] is None

    assert failed == "failed"
    mine = ledger.failures(run)
    assert [(f["chunk_id"], f["kind"], f["last_error"]) for f in mine] == [
        (2, "users", "boom: shard 7 refused")]
    assert mine[0]["args"] and mine[0]["attempts"] == 1
    assert {f["run_id"] for f in ledger.failures()} >= {run, other}
    assert len(ledger.failures(limit=1)) == 1
    assert ledger.chunk_counts(run) == [{"pins": 8}]
    assert ledger.chunk_counts(other) == []
