"""Mass enqueue and item jobs on real Redis with a real rq worker."""

import json
import pickle
import subprocess
import sys
import zlib

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from farmcore import keys
from jobs import enqueue_many
from jobs.queue import rq_queue
from shardfarm.errors import FatalError
from tests.conftest import ROOT


@pytest.fixture
def conn(settings):
    c = redis.Redis.from_url(settings.redis_url)
    c.flushdb()
    yield c
    c.flushdb()


def _drain(conn, queue):
    w = SimpleWorker([rq_queue(conn, queue)], connection=conn, serializer=JSONSerializer)
    w.work(burst=True)


@pytest.mark.slow
def test_enqueue_dedup_and_run(conn):
    items = [{"key": f"k{i}", "value": i} for i in range(250)]
    r1 = enqueue_many("t", "tests.kinds.record", items, connection=conn, batch=100)
    assert r1.as_dict() == {"enqueued": 250, "duplicates": 0}
    assert conn.llen("rq:queue:t") == 3
    r2 = enqueue_many("t", "tests.kinds.record", [*items[:50], {"key": "new", "value": 1}],
                      connection=conn)
    assert r2.as_dict() == {"enqueued": 1, "duplicates": 50}
    _drain(conn, "t")
    assert conn.hlen("test:record") == 251
    assert int(conn.get(keys.items_queued("t"))) == 0


def test_fatal_item_fails_alone_with_reason(conn):
    items = [{"key": "a", "value": 1}, {"key": "bad", "value": -1}, {"key": "c", "value": 3}]
    enqueue_many("t", "tests.kinds.record", items, connection=conn)
    _drain(conn, "t")
    assert set(conn.hkeys("test:record")) == {b"a", b"c"}
    failed = [json.loads(v) for v in conn.hvals(keys.failed_items("t"))]
    assert len(failed) == 1 and "negative value" in failed[0]["error"]


def test_unimportable_function_refused(conn):
    with pytest.raises(FatalError, match="cannot import"):
        enqueue_many("t", "tests.kinds.nosuch.fn", [{}], connection=conn)
    with pytest.raises(FatalError, match="not allowed"):
        enqueue_many("t", "no.such.module.fn", [{}], connection=conn)
    with pytest.raises(FatalError, match="JSON object"):
        enqueue_many("t", "tests.kinds.record", [[1, 2]], connection=conn)


def test_pickled_job_is_refused_not_unpickled(conn, tmp_path):
    marker = tmp_path / "pwned"
    q = Queue("t", connection=conn)  # default serializer: pickle, as an outsider would
    job = q.enqueue("tests.kinds.record", key="x", value=1)
    evil = pickle.dumps(("os.system", None, (f"touch {marker}",), {}))
    conn.hset(job.key, "data", zlib.compress(evil))
    _drain(conn, "t")
    assert not marker.exists()
    failed = Job.fetch(job.id, connection=conn, serializer=JSONSerializer)
    assert failed.get_status() == "failed"
    assert "DeserializationError" in (failed.latest_result().exc_string or "")


def test_farm_enqueue_cli_streams_stdin(conn, farm_env):
    lines = "\n".join(json.dumps({"key": f"c{i}", "value": i}) for i in range(1000))
    cmd = [sys.executable, "-m", "scripts", "enqueue", "t", "tests.kinds.record", "--file", "-"]
    out = subprocess.run(cmd, input=lines, env=farm_env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"enqueued": 1000, "duplicates": 0}
    out = subprocess.run(cmd, input=lines, env=farm_env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"enqueued": 0, "duplicates": 1000}
