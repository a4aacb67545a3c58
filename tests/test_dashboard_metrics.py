"""``/metrics`` scraped over HTTP from the real ``farm dashboard`` and a real supervisor
(``farm workers --metrics-port``), each value checked against counts this test takes itself
from the control database, Redis, the export folder and the process table (never through the
collectors' code)."""

from __future__ import annotations

import re
import socket

import pymysql
import pytest
import redis

from farmcore.ledger import ChunkSpec
from jobs import runs
from tests.conftest import SHARDS_A, ns_db, run_farm
from tests.dashkit import dashboard, labels, make_run, scrape
from tests.farmkit import children, start_workers, stop, until
from tests.servers import free_port

pytestmark = pytest.mark.usefixtures("park_leftover_runs")


def sql(query: str, *params) -> list[tuple]:
    """A query of the test's control database on a connection of its own."""
    conn = pymysql.connect(host="127.0.0.1", user="root", database=ns_db("farm_control_test"))
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_dashboard_metrics_match_the_ledger(rt, env, tmp_path):
    run_id = make_run(rt.ledger, done=2, failed=1, pending=3,
                      quarantined=[("pins", "1", "orphan_pin", None),
                                   ("pins", "2", "orphan_pin", None),
                                   ("boards", "3", "no_owner", None)])
    rt.ledger.set_paused(run_id, True)
    dest = tmp_path / "exports"
    (dest / "pins" / "dt=2026-11-20").mkdir(parents=True)
    (dest / "pins" / "dt=2026-11-20" / "_SUCCESS").write_bytes(b"")
    rt.ledger.create_run("export", "farm", {"kinds": ["pins", "users"], "date": "2026-11-20",
                                            "dest": f"file://{dest}"}, [])
    queued = runs.start(rt, "test", "tests.kinds.write_edges",
                        [ChunkSpec("edges", {"shard": SHARDS_A[0], "start": 1, "count": 1})])
    with dashboard(env) as (url, _):
        got = scrape(url + "metrics")
    for state, n in sql("SELECT state, COUNT(*) FROM chunks WHERE run_id = %s GROUP BY state",
                        run_id):
        assert got[("shardfarm_run_chunks", labels(kind="test", run_id=run_id,
                                                   state=state))] == n
    for kind, read, written, quarantined in sql(
            "SELECT kind, SUM(rows_read), SUM(rows_written), SUM(rows_quarantined) FROM chunks "
            "WHERE run_id = %s AND state = 'done' GROUP BY kind", run_id):
        key = labels(run_id=run_id, table=kind)
        assert got[("shardfarm_rows_read_total", key)] == read
        assert got[("shardfarm_rows_written_total", key)] == written
        assert got[("shardfarm_rows_quarantined_total", key)] == quarantined == 3
    for table, reason, n in sql("SELECT legacy_table, reason, COUNT(*) FROM quarantine "
                                "WHERE run_id = %s GROUP BY legacy_table, reason", run_id):
        assert got[("shardfarm_quarantined_rows", labels(reason=reason, run_id=run_id,
                                                         table=table))] == n
    (paused,), = sql("SELECT paused FROM runs WHERE run_id = %s", run_id)
    assert got[("shardfarm_run_paused", labels(run_id=run_id))] == paused == 1
    assert got[("shardfarm_run_paused", labels(run_id=queued))] == 0
    depth = redis.Redis.from_url(env["FARM_REDIS_URL"]).llen("rq:queue:farm")
    assert got[("shardfarm_queue_jobs", labels(queue="farm"))] == depth == 1
    assert got[("shardfarm_export_success", labels(date="2026-11-20", table="pins"))] == 1
    assert got[("shardfarm_export_success", labels(date="2026-11-20", table="users"))] == 0


@pytest.mark.slow
def test_supervisor_metrics_count_the_jobs_its_workers_ran(rt, env):
    port = free_port()
    run_id = runs.start(rt, "test", "tests.kinds.write_edges",
                        [ChunkSpec("edges", {"shard": SHARDS_A[0] + 6, "start": 2_000 + 50 * i,
                                             "count": 50}) for i in range(6)])
    sup = start_workers(env, 2, "--metrics-port", str(port))
    try:
        assert runs.wait(rt, run_id, timeout=60) == "done"
        (done, busy_s), = sql("SELECT COUNT(*), SUM(seconds) FROM chunks WHERE run_id = %s "
                              "AND state = 'done'", run_id)
        url = f"http://127.0.0.1:{port}/metrics"
        key = ("shardfarm_job_duration_seconds_count", labels(outcome="finished", queue="farm"))
        seen: list[dict] = []

        def settled() -> dict | None:  # two scrapes a tick apart agree on every job counted
            seen.append(scrape(url))
            ok = len(seen) > 1 and seen[-1].get(key, 0) == seen[-2].get(key, -1) > 0
            return seen[-1] if ok else None
        jobs = until(settled, every=1.5, what="the latency histogram to settle")
        # a job may carry several chunks, and a chunk may be dispatched more than once:
        # the histogram counts rq jobs, checked against the jobs rq itself logged
        assert jobs[("shardfarm_jobs_ended_total", labels(outcome="finished", queue="farm"))] \
            == jobs[key] >= 1
        assert jobs[("shardfarm_job_duration_seconds_sum",
                     labels(outcome="finished", queue="farm"))] >= busy_s * 0.99
        assert done == 6
        procs = len(children(sup.pid))
        def registered(m: dict) -> float:  # workers that rq's registry knows, any state
            return sum(v for k, v in m.items() if k[0] == "shardfarm_supervisor_workers"
                       and dict(k[1])["state"] not in ("desired", "alive"))
        got = until(lambda: (m := scrape(url)).get(
            ("shardfarm_supervisor_workers", labels(host=_host(m), state="alive"))) == procs
            and registered(m) == procs and m,
            what="the live workers counted, each registered with rq")
        by_state = {dict(k[1])["state"]: v for k, v in got.items()
                    if k[0] == "shardfarm_supervisor_workers"}
        assert by_state["desired"] == 2 == procs
        rq_states = {k: v for k, v in by_state.items() if k not in ("desired", "alive")}
        assert sum(rq_states.values()) == procs, by_state
    finally:
        log = stop(sup)
    assert len(re.findall(r": Job OK \(", log)) == jobs[key], log[-3000:]


def _host(metrics: dict) -> str | None:
    """The host label the supervisor's series carry."""
    return next((dict(k[1])["host"] for k in metrics
                 if k[0] == "shardfarm_supervisor_workers"), None)


def test_a_metrics_port_in_use_is_one_line_and_exit_1(env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = run_farm(env, "workers", "--count", "1", "--metrics-port",
                       str(busy.getsockname()[1]), timeout=60)
    assert out.returncode == 1, out.stderr
    assert "port is in use" in out.stderr and "--metrics-port" in out.stderr
    assert "Traceback" not in out.stderr
