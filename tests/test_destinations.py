"""Export destinations and the files that finish a table: a part becomes visible only when
committed (S3 multipart on moto's server, a rename on a directory), the manifest and
``_SUCCESS`` are written last and once, even by finalizers racing each other, and the
dump's read-ahead keeps order and stops with its consumer."""

import json
import os
import threading

import pytest

from exporters import export as exporter
from exporters.destinations import FileDestination, S3Destination
from exporters.partlog import FolderBusyError
from shardfarm.errors import RetryableError
from tests.test_export import BUCKET, DATE, s3  # noqa: F401 - the S3 server fixture


def test_s3_multipart_is_invisible_until_commit_and_abort_leaves_nothing(s3):  # noqa: F811
    dest = S3Destination(BUCKET, "mp")
    payload = os.urandom(11 * 1024 * 1024 + 17)
    w = dest.open_part("big.bin")
    for i in range(0, len(payload), 1 << 20):
        w.write(payload[i:i + (1 << 20)])
    assert w.upload_id is not None and not dest.exists("big.bin")  # parts sent, not visible
    w.commit()
    assert dest.read("big.bin") == payload and len(w.parts) == 2
    with pytest.raises(RuntimeError), dest.open_part("aborted.bin") as w2:
        w2.write(payload)
        raise RuntimeError("dies half way")
    assert not dest.exists("aborted.bin")
    assert not s3["client"].list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_file_destination_renames_and_abort_leaves_no_temp(tmp_path):
    dest = FileDestination(tmp_path)
    w = dest.open_part("t/dt=x/part-00001.jsonl.gz")
    w.write(b"abc")
    assert dest.list("t/") == [] or all(p.split("/")[-1].startswith(".")
                                        for p in dest.list("t/"))
    assert not dest.exists("t/dt=x/part-00001.jsonl.gz")
    w.commit()
    assert dest.read("t/dt=x/part-00001.jsonl.gz") == b"abc"
    with pytest.raises(KeyError), dest.open_part("t/dt=x/part-00002.jsonl.gz") as w2:
        w2.write(b"x")
        raise KeyError("boom")
    assert dest.list("t/") == ["t/dt=x/part-00001.jsonl.gz"]


class Recording(FileDestination):
    def __init__(self, root):
        super().__init__(root)
        self.writes: list[str] = []

    def put(self, key, data, *fence):
        self.writes.append(key.rsplit("/", 1)[-1])
        super().put(key, data, *fence)


def test_manifest_then_success_written_last_and_only_once(tmp_path):
    dest = Recording(tmp_path)
    parts = [exporter.Part(f"part-{s:05d}.jsonl.gz", s, 3, 10, "ab" * 32) for s in (2, 1)]
    doc = exporter.manifest_doc("users", DATE, "jsonl", parts)
    assert [f["shard"] for f in doc["files"]] == [1, 2] and (doc["rows"], doc["bytes"]) == (6, 20)
    exporter.write_final(dest, "users/dt=x/", doc)
    assert dest.writes == ["_manifest.json", "_SUCCESS"]
    exporter.write_final(dest, "users/dt=x/", doc)
    assert dest.writes == ["_manifest.json", "_SUCCESS"]  # identical: nothing written again


def test_concurrent_finalizers_agree(tmp_path):
    """Two chunks completing a table at once both write the same manifest; _SUCCESS stays."""
    dest = FileDestination(tmp_path)
    parts = [exporter.Part(f"part-{s:05d}.jsonl.gz", s, 1, 1, "cd" * 32) for s in range(4)]
    doc = exporter.manifest_doc("pins", DATE, "jsonl", parts)
    threads = [threading.Thread(target=exporter.write_final, args=(dest, "pins/dt=x/", doc))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(dest.read("pins/dt=x/_manifest.json")) == doc
    assert dest.exists("pins/dt=x/_SUCCESS")


def test_prefetched_keeps_order_raises_reader_errors_and_stops_early():
    from exporters.dump import prefetched
    assert list(prefetched(iter(range(100)), depth=3)) == list(range(100))

    def failing():
        yield 1
        raise ConnectionError("lost the server")
    got = []
    with pytest.raises(ConnectionError, match="lost the server"):
        for x in prefetched(failing()):
            got.append(x)
    assert got == [1]
    produced = []

    def endless():
        n = 0
        while True:
            produced.append(n)
            yield n
            n += 1
    gen = prefetched(endless(), depth=2)
    assert next(gen) == 0
    gen.close()  # the reader stops (the join returns) and read at most depth + 2 ahead
    assert len(produced) <= 5 and not [t for t in threading.enumerate()
                                       if t.name == "export-reader"]


def test_finalizers_under_the_folder_lock_write_once(ledger, tmp_path):
    """Chunks completing a table at the same moment: the named lock makes the later ones find
    the manifest and _SUCCESS written, so nothing is withdrawn or written twice."""
    dest = Recording(tmp_path)
    log_ = exporter.PartLog(ledger.pool, dest.url)
    parts = [exporter.Part(f"part-{s:05d}.jsonl.gz", s, 1, 1, "ef" * 32) for s in range(4)]
    doc = exporter.manifest_doc("likes", DATE, "jsonl", parts)
    gate = threading.Barrier(4)

    def finalizer() -> None:
        gate.wait()
        with log_.lock("likes/dt=x/"):
            exporter.write_final(dest, "likes/dt=x/", doc)
    threads = [threading.Thread(target=finalizer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dest.writes == ["_manifest.json", "_SUCCESS"]
    other = exporter.PartLog(ledger.pool, dest.url)
    with log_.lock("likes/dt=x/"), pytest.raises(RetryableError), other.lock("likes/dt=x/", 0):
        pass


def test_one_directory_is_one_destination_however_it_is_spelled(router, ledger, tmp_path):
    """``..``, ``.`` and a symlink name the same directory: a second export of the same
    folder spelled so is refused while the first runs (and its chunks claim the same folder)
    instead of writing beside it under a success marker of its own."""
    (tmp_path / "a").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "link")
    first, chunks = exporter.plan(router, DATE, f"file://{tmp_path}/a", ["users"])
    run = ledger.create_run("export", "farm", first, chunks)
    try:
        for spelled in (f"file://{tmp_path}/b/../a", f"file://{tmp_path}/link",
                        f"file://{tmp_path}/./a/"):
            params, _ = exporter.plan(router, DATE, spelled, ["users"])
            assert params["dest"] == first["dest"] == f"file://{tmp_path}/a"
            with pytest.raises(FolderBusyError, match=run):
                exporter.refuse_overlap(ledger, params)
    finally:
        ledger.pool.execute("UPDATE runs SET status = 'done' WHERE run_id = %s", (run,))
