"""Status reads (``farm status``, the dashboard, ``/metrics``) end within FARM_STATUS_TIMEOUT
when the control database does not answer: a ``LOCK TABLES`` another session holds (the
server's lock wait would last a day), or a network that stops forwarding (a frozen TCP
proxy the test controls), or when Redis does not answer. Bulk work keeps statements
without a bound."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import pymysql
import pytest
import redis

from dashboard.model import Reader
from farmcore.ledger import Ledger
from jobs.runtime import Runtime
from shardfarm.bounds import (
    BULK,
    REDIS_REPLY_LIMIT,
    Bound,
    redis_error_line,
    status_bound,
    wrong_type,
)
from shardfarm.errors import StatementTimeoutError
from shardfarm.mysql.dsn import DSN
from tests.conftest import ROOT, run_farm
from tests.dashkit import dashboard, get, make_run
from tests.farmkit import until, within
from tests.proxy import TcpProxy
from tests.servers import PrivateRedis, free_port

pytestmark = pytest.mark.usefixtures("park_leftover_runs")
SECONDS = 2


@contextmanager
def runs_locked(settings, *tables: str) -> Iterator[pymysql.Connection]:
    """Another session holds ``LOCK TABLES runs WRITE`` (or each of ``tables``) on the
    control database."""
    dsn = settings.control_dsn
    conn = pymysql.connect(host=dsn.host, port=dsn.port, user=dsn.user,
                           password=dsn.password, database=dsn.database, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("LOCK TABLES " + ", ".join(f"{t} WRITE" for t in tables or ["runs"]))
        yield conn
    finally:
        conn.close()  # the lock goes with the session


def _waiting_on_the_lock(holder: pymysql.Connection) -> int:
    """Sessions the server still has waiting for the lock (none once a bound ended them)."""
    with holder.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() "
                    "AND state LIKE 'Waiting for table metadata lock%%'")
        return int(cur.fetchone()[0])


def test_a_status_read_ends_within_the_bound_and_the_server_ends_it_too(settings, ledger):
    make_run(ledger)
    rt = Runtime(settings, bound=Bound(SECONDS))
    try:
        with runs_locked(settings) as holder:
            exc, took = within(SECONDS + 8, lambda: Reader(rt).board())
            assert _waiting_on_the_lock(holder) == 0  # not left waiting for a day
    finally:
        rt.close()
    assert isinstance(exc, StatementTimeoutError), repr(exc)
    assert SECONDS <= took < SECONDS + 2, took
    dsn = settings.control_dsn
    assert str(exc).startswith(
        f"MySQL control (root@127.0.0.1:3306/{dsn.database}) did not answer within 2 s "
        "(FARM_STATUS_TIMEOUT)")


def test_bulk_statements_have_no_bound(settings, ledger, router, monkeypatch):
    """A statement longer than the status bound: refused on a status pool, run to the end on
    the ledger's and the shards' own (a LOAD DATA or an export may run for minutes)."""
    monkeypatch.setenv("FARM_STATUS_TIMEOUT", "1")
    status = Ledger(settings.control_dsn, bound=status_bound())
    try:
        with pytest.raises(StatementTimeoutError, match="did not answer within 1 s"):
            status.pool.query("SELECT SLEEP(2.5)")
    finally:
        status.close()
    assert ledger.pool.bound == BULK
    assert ledger.pool.query("SELECT SLEEP(2.5)") == [(0,)]
    host = router.host_for(next(router.shardmap.shards()))
    assert router.query(host, "SELECT SLEEP(2.5)") == [(0,)]


def test_the_legacy_position_a_status_view_reads_is_bounded_too(settings):
    """``farm status`` and the dashboard read the legacy server's binlog position (sync's
    lag) with the status view's bound; a migration's reader has none."""
    from loaders.migration.legacy import LegacyReader
    bounded, bulk = LegacyReader(settings.control_dsn, Bound(1)), LegacyReader(
        settings.control_dsn)
    try:
        with pytest.raises(StatementTimeoutError, match="did not answer within 1 s"):
            bounded.query("SELECT SLEEP(2.5)")
        assert bulk.query("SELECT SLEEP(2.5)") == [(0,)]
    finally:
        bounded.close()
        bulk.close()


def test_a_frozen_network_ends_a_status_read_within_the_bound(settings, ledger):
    """The control database behind a proxy that stops forwarding: the read waits for its
    socket (the bound and a second), not for minutes; once it flows again, reads work."""
    make_run(ledger)
    dsn = settings.control_dsn
    with TcpProxy.start(dsn.port) as proxy:
        via = DSN.parse(f"mysql://root@127.0.0.1:{proxy.port}/{dsn.database}",
                        what="FARM_CONTROL_DSN")
        rt = Runtime(settings.with_(control_dsn=via), bound=Bound(SECONDS))
        try:
            reader = Reader(rt)
            assert reader.board().runs  # connected, its connection pooled
            proxy.freeze()
            try:
                exc, took = within(SECONDS + 8, lambda: reader.run_rows(5))
            finally:
                proxy.thaw()
            assert isinstance(exc, StatementTimeoutError), repr(exc)
            assert "did not answer within 2 s" in str(exc) and took < SECONDS + 2
            assert reader.run_rows(5)
        finally:
            rt.close()


@pytest.mark.parametrize("command", [("status",), ("runs",), ("summary", "RUN"), ("failed",),
                                     ("failed", "--run", "RUN"), ("quarantine", "--run", "RUN")],
                         ids="-".join)
def test_status_commands_say_so_in_one_line(farm_env, settings, ledger, command):
    """Every read-only view of the ledger gives up within the bound (``farm runs``, ``summary``,
    ``failed`` and ``quarantine`` used to wait as long as the lock was held)."""
    env = {**farm_env, "FARM_STATUS_TIMEOUT": str(SECONDS)}
    run_id = make_run(ledger)
    args = [run_id if a == "RUN" else a for a in command]
    with runs_locked(settings, "runs", "chunks", "quarantine"):
        t0 = time.monotonic()
        try:
            out = run_farm(env, *args, timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail(f"farm {' '.join(command)} still waiting after 40 s")
        took = time.monotonic() - t0
    assert out.returncode == 1 and took < SECONDS + 8, (took, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("farm: error: MySQL control (root@127.0.0.1:3306/")
    assert "did not answer within 2 s (FARM_STATUS_TIMEOUT)" in lines[0]


def test_a_bad_status_timeout_is_one_line(farm_env):
    out = run_farm({**farm_env, "FARM_STATUS_TIMEOUT": "soon"}, "status")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == ("farm: error: bad FARM_STATUS_TIMEOUT: 'soon' (a number of "
                                  "seconds > 0, at most 3600)")


def _pages_fail_fast(url: str) -> None:
    """``/``, ``/fragment`` and ``/metrics`` each answer 503 within the bound, saying why."""
    for path in ("", "fragment", "metrics"):
        t0 = time.monotonic()
        status, body = get(url + path)
        took = time.monotonic() - t0
        assert status == 503 and took < SECONDS + 3, (path, status, took)
        assert "did not answer within 2 s" in body, body[:500]


def test_the_dashboard_answers_while_the_runs_table_is_locked(env, settings, ledger):
    make_run(ledger)
    with dashboard({**env, "FARM_STATUS_TIMEOUT": str(SECONDS)}) as (url, _):
        with runs_locked(settings):
            _pages_fail_fast(url)
        assert get(url)[0] == 200  # and it recovers once the lock is gone


def test_the_dashboard_answers_while_the_network_is_frozen(env, settings, ledger):
    make_run(ledger)
    dsn = settings.control_dsn
    with TcpProxy.start(dsn.port) as proxy:
        via = f"mysql://root@127.0.0.1:{proxy.port}/{dsn.database}"
        with dashboard({**env, "FARM_STATUS_TIMEOUT": str(SECONDS),
                        "FARM_CONTROL_DSN": via}) as (url, _):
            assert get(url)[0] == 200  # its connections are pooled now
            proxy.freeze()
            status, body = get(url + "fragment")
            assert status == 503 and "did not answer within 2 s" in body, body[:500]
            proxy.thaw()
            assert get(url)[0] == 200


def _via(url: str, port: int) -> str:
    """``url`` (the farm's Redis) through a proxy listening on ``port``."""
    return url.replace("127.0.0.1:6379", f"127.0.0.1:{port}", 1)


def test_farm_status_ends_within_the_bound_when_redis_does_not_answer(env, ledger):
    """Redis accepts the connection and never replies: ``farm status`` gives up after the
    bound with one line (before, it waited for ever on its first Redis read)."""
    make_run(ledger)
    proxy = TcpProxy.silent()
    try:
        run_env = {**env, "FARM_STATUS_TIMEOUT": str(SECONDS),
                   "FARM_REDIS_URL": _via(env["FARM_REDIS_URL"], proxy.port)}
        t0 = time.monotonic()
        try:
            out = run_farm(run_env, "status", timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail("farm status still waiting for Redis after 40 s")
        took = time.monotonic() - t0
    finally:
        proxy.stop()
    assert out.returncode == 1 and took < SECONDS + 8, (took, out.stderr)
    lines = [x for x in out.stderr.strip().splitlines() if x.startswith("farm:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("farm: error: Redis: Timeout") and "FARM_STATUS_TIMEOUT" in \
        lines[0], lines[0]


def test_every_command_ends_within_the_reply_bound_when_redis_does_not_answer(env, ledger,
                                                                            tmp_path):
    """Redis accepts and never replies, or a ``rediss://`` URL names a plain Redis (the TLS
    handshake waits for ever): commands other than status views waited for ever with no
    output; now each ends after ``REDIS_REPLY_LIMIT`` with one line that names the URL
    to check. The commands run at once, so the test takes one bound."""
    run_id = make_run(ledger)
    items = tmp_path / "items.jsonl"
    items.write_text('{"key": "k", "value": 1}\n')
    proxy = TcpProxy.silent()
    silent = _via(env["FARM_REDIS_URL"], proxy.port)
    tls = env["FARM_REDIS_URL"].replace("redis://", "rediss://", 1)
    cases = [(silent, ["scale", "1"]), (silent, ["resume", run_id]),
             (silent, ["enqueue", "q", "tests.kinds.record", "--file", str(items)]),
             (tls, ["scale", "1"])]
    try:
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "scripts", *argv], cwd=ROOT,
                                  env={**env, "FARM_REDIS_URL": url}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for url, argv in cases]
        outs = [p.communicate(timeout=REDIS_REPLY_LIMIT + 30) for p in procs]
        took = time.monotonic() - t0
    finally:
        proxy.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert took < REDIS_REPLY_LIMIT + 15, took
    for (_, argv), p, (_, err) in zip(cases, procs, outs, strict=True):
        lines = [x for x in err.strip().splitlines() if x.startswith("farm:")]
        assert p.returncode == 1 and "Traceback" not in err, (argv, err)
        assert lines[-1].startswith("farm: error: Redis: Timeout"), (argv, err)
        assert f"{REDIS_REPLY_LIMIT:g} s for any other reply" in lines[-1], lines[-1]


def test_the_dashboard_answers_while_redis_is_frozen(env, ledger):
    make_run(ledger)
    proxy = TcpProxy.start(6379)
    page_env = {**env, "FARM_STATUS_TIMEOUT": str(SECONDS),
                "FARM_REDIS_URL": _via(env["FARM_REDIS_URL"], proxy.port)}
    with proxy, dashboard(page_env) as (url, _):
        assert get(url)[0] == 200  # its Redis connection is open now
        proxy.freeze()
        t0 = time.monotonic()
        status, body = get(url + "fragment")
        took = time.monotonic() - t0
        assert status == 503 and "Redis: Timeout" in body and took < SECONDS + 3, (
            status, took, body[:500])
        proxy.thaw()
        assert get(url)[0] == 200


def _waiting_since(holder: pymysql.Connection) -> float:
    """The moment a session was first seen waiting for ``holder``'s lock."""
    until(lambda: _waiting_on_the_lock(holder) > 0, timeout=20, what="a session to wait")
    return time.monotonic()


def test_a_dashboard_action_is_not_cut_short_by_the_status_bound(env, settings, ledger):
    """Actions run as their ``farm`` commands do: a retry that waits longer than
    FARM_STATUS_TIMEOUT for a lock completes (pages keep their bound)."""
    run_id = make_run(ledger, done=0, failed=2, pending=0)
    page_env = {**env, "FARM_STATUS_TIMEOUT": str(SECONDS), "FARM_DASHBOARD_TOKEN": "tok"}
    with dashboard(page_env, "--allow-actions") as (url, _):
        form = urllib.parse.urlencode({"action": "retry-failed", "run_id": run_id,
                                       "token": "tok"}).encode()
        with runs_locked(settings, "chunks") as holder:
            answer: list = []
            post = threading.Thread(target=lambda: answer.append(get(url + "action", form)))
            post.start()
            since = _waiting_since(holder)
            until(lambda: time.monotonic() - since > SECONDS + 1.5, what="the bound to pass")
            assert _waiting_on_the_lock(holder) == 1  # still waiting: not ended at the bound
        post.join(timeout=30)
    assert answer and answer[0][0] == 303, answer
    assert ledger.chunk(run_id, 0)["state"] == "pending"  # given back


def test_an_error_redis_answers_with_says_what_it_is_not_to_check_the_url():
    """Redis reached and answering with an error (a key of another type, an unknown command,
    out of memory) is not a Redis to look for: before, every such line said "check
    FARM_REDIS_URL and that Redis is running"."""
    server = PrivateRedis.start()
    try:
        conn = redis.Redis.from_url(server.url())
        conn.set("farm:k", "text")
        lines = []
        for command in (("HGET", "farm:k", "f"), ("NOSUCHCOMMAND",)):
            with pytest.raises(redis.ResponseError) as err:
                conn.execute_command(*command)
            lines.append(redis_error_line(err.value))
        conn.config_set("maxmemory", "1")
        with pytest.raises(redis.ResponseError) as err:
            conn.set("farm:other", "x")
        lines.append(redis_error_line(err.value))
    finally:
        server.stop()
    assert all("\n" not in x and "that Redis is running" not in x for x in lines), lines
    assert lines[0].startswith("Redis: WRONGTYPE") and "another type" in lines[0], lines[0]
    assert "server's log" in lines[1], lines[1]
    assert "out of memory: raise its maxmemory" in lines[2], lines[2]
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    assert "check FARM_REDIS_URL and that Redis is running" in redis_error_line(refused)


def test_a_redis_database_past_the_servers_is_named_as_the_url_to_fix(farm_env):
    """Before, FARM_REDIS_URL=redis://host:6379/99 said "DB index is out of range (Redis
    answered with this error: see the Redis server's log)": nothing named the URL."""
    url = farm_env["FARM_REDIS_URL"].rsplit("/", 1)[0] + "/99"
    out = run_farm({**farm_env, "FARM_REDIS_URL": url}, "scale", "--clear", timeout=60)
    assert (out.returncode, out.stdout) == (1, ""), out
    assert out.stderr.splitlines() == [
        "farm: error: Redis: DB index is out of range (the database number at the end of "
        "FARM_REDIS_URL is past the server's 'databases' setting (16 by default: 0 to 15))"]


def test_wrong_type_is_told_apart_from_other_refusals_alone_or_in_a_pipeline():
    """``WRONGTYPE`` (a key something else wrote) is recognised from a lone command and from
    a pipeline (whose error text starts with the command), and a read-only replica's refusal
    of a pipeline whose value reads "WRONGTYPE" is not taken for it."""
    server = PrivateRedis.start()
    try:
        conn = redis.Redis.from_url(server.url())
        conn.set("farm:k", "text")
        with pytest.raises(redis.ResponseError) as alone:
            conn.hset("farm:k", "f", "v")
        pipe = conn.pipeline(transaction=False)
        pipe.hset("farm:k", "f", "v")
        with pytest.raises(redis.ResponseError) as piped:
            pipe.execute()
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        pipe = conn.pipeline(transaction=False)
        pipe.hset("farm:h", "f", "WRONGTYPE")
        with pytest.raises(redis.ResponseError) as readonly:
            pipe.execute()
    finally:
        server.stop()
    assert wrong_type(alone.value) and wrong_type(piped.value), (alone.value, piped.value)
    assert "WRONGTYPE" in str(readonly.value) and not wrong_type(readonly.value), readonly.value
    assert not wrong_type(RuntimeError("WRONGTYPE"))
