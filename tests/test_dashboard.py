"""The dashboard's page, fragment and actions (Flask's test client over the real ledger and
Redis), and the command's one-line refusals (the real ``farm dashboard``)."""

from __future__ import annotations

import logging
import socket

import pytest

from dashboard.actions import Guard
from dashboard.app import create_app
from farmcore import keys
from farmcore.ledger import ChunkSpec
from farmcore.syncstate import ROW
from tests.conftest import run_farm
from tests.dashkit import TOKEN, make_run

pytestmark = pytest.mark.usefixtures("park_leftover_runs")


@pytest.fixture
def client_for(rt):
    def make(allow=False, token=None):
        app = create_app(rt, Guard(allow=allow, token=token))
        return app.test_client()
    return make


def test_page_shows_each_run_with_rows_chunks_failures_and_quarantine(rt, client_for):
    run_id = make_run(rt.ledger, done=1, failed=1, pending=2,
                      quarantined=[("pins", "17", "orphan_pin", None)])
    page = client_for().get("/").get_data(as_text=True)
    assert run_id in page and "read-only" in page
    assert "100 / 400" in page and "1 / 4" in page and "1 failed" in page
    assert "bad chunk on purpose" in page and "orphan_pin: 1" in page
    assert "<svg" in page and 'id="workers"' in page and 'id="queues"' in page
    assert "act-pause" not in page  # read-only: no action buttons


def test_fragment_is_the_live_part_only(rt, client_for):
    run_id = make_run(rt.ledger)
    body = client_for().get("/fragment").get_data(as_text=True)
    assert run_id in body and 'id="runs"' in body and "<html" not in body


def test_a_throttled_run_says_why(rt, client_for):
    run_id = make_run(rt.ledger)
    rt.redis.set(keys.throttle(run_id), "TestA1 Threads_running 9 > 3", ex=30)
    body = client_for().get("/fragment").get_data(as_text=True)
    assert "state-throttled" in body and "Threads_running 9 &gt; 3" in body


def test_no_other_site_may_frame_it_or_put_words_in_its_mouth(rt, client_for):
    """Every answer forbids framing; a note in the address is not shown (only an action's own
    result is, once); a page number past any offset MySQL takes is capped, not an error."""
    make_run(rt.ledger)
    client = client_for(True, TOKEN)
    for path in ("/", "/fragment", "/metrics", "/confirm?action=nope"):
        resp = client.get(path)
        assert resp.headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"], path
    forged = client.get("/?note=Your+token+expired:+log+in+at+evil.example")
    assert "evil.example" not in forged.get_data(as_text=True)
    assert client.get("/?page=99999999999999999999").status_code == 200
    assert client.get("/fragment?page=9223372036854775807&limit=200").status_code == 200


def test_an_actions_note_is_shown_once(rt, client_for):
    run_id = make_run(rt.ledger)
    client = client_for(True, TOKEN)
    resp = client.post("/action", data={"action": "pause", "run_id": run_id, "token": TOKEN})
    assert resp.status_code == 303 and resp.headers["Location"] == "/"
    assert f"paused {run_id}" in client.get("/").get_data(as_text=True)
    assert f"paused {run_id}" not in client.get("/").get_data(as_text=True).split('id="live"')[0]


def test_read_only_refuses_every_action(rt, client_for):
    run_id = make_run(rt.ledger)
    client = client_for()
    resp = client.post("/action", data={"action": "pause", "run_id": run_id, "token": TOKEN})
    assert resp.status_code == 403 and "read-only" in resp.get_data(as_text=True)
    assert client.get(f"/confirm?action=pause&run_id={run_id}").status_code == 403
    assert rt.ledger.run(run_id)["paused"] is False


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x"])
def test_actions_without_the_right_token_are_refused(rt, client_for, token):
    run_id = make_run(rt.ledger)
    data = {"action": "pause", "run_id": run_id}
    if token is not None:
        data["token"] = token
    resp = client_for(True, TOKEN).post("/action", data=data)
    assert resp.status_code == 403 and "wrong or missing token" in resp.get_data(as_text=True)
    assert rt.ledger.run(run_id)["paused"] is False


def test_allow_actions_needs_a_token():
    with pytest.raises(Exception, match="needs a token"):
        Guard(allow=True, token=None)


def test_confirm_then_pause_and_the_token_is_never_shown_or_logged(rt, client_for, caplog):
    caplog.set_level(logging.DEBUG)
    run_id = make_run(rt.ledger)
    client = client_for(True, TOKEN)
    page = client.get("/").get_data(as_text=True)
    assert "act-pause" in page and TOKEN not in page
    confirm = client.get(f"/confirm?action=pause&run_id={run_id}").get_data(as_text=True)
    assert f"Pause run {run_id}?" in confirm and TOKEN not in confirm
    assert rt.ledger.run(run_id)["paused"] is False  # the confirmation step changed nothing
    resp = client.post("/action", data={"action": "pause", "run_id": run_id, "token": TOKEN})
    assert resp.status_code == 303 and TOKEN not in resp.headers["Location"]
    assert rt.ledger.run(run_id)["paused"] is True
    after = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert f"paused {run_id}" in after and "state-paused" in after and TOKEN not in after
    assert TOKEN not in caplog.text


def test_unpause_retry_failed_and_scale_with_a_bearer_token(rt, client_for):
    run_id = make_run(rt.ledger, done=0, failed=1, pending=1)
    rt.ledger.set_paused(run_id, True)
    client, auth = client_for(True, TOKEN), {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/action", data={"action": "unpause", "run_id": run_id},
                       headers=auth).status_code == 303
    assert rt.ledger.run(run_id)["paused"] is False
    assert client.post("/action", data={"action": "retry-failed", "run_id": run_id},
                       headers=auth).status_code == 303
    assert rt.ledger.chunk(run_id, 0)["state"] == "pending"
    assert client.post("/action", data={"action": "scale", "count": "3", "host": ""},
                       headers=auth).status_code == 303
    assert rt.redis.get(keys.desired_workers(None)) == b"3"


def test_cancel_is_confirmed_then_ends_the_run_and_its_line_says_how(rt, client_for):
    run_id = make_run(rt.ledger, done=1, failed=0, pending=2)
    client = client_for(True, TOKEN)
    assert "act-cancel" in client.get("/").get_data(as_text=True)
    confirm = client.get(f"/confirm?action=cancel&run_id={run_id}").get_data(as_text=True)
    assert f"Cancel run {run_id}?" in confirm
    assert rt.ledger.refresh_status(run_id) == "running"  # the confirmation changed nothing
    resp = client.post("/action", data={"action": "cancel", "run_id": run_id, "token": TOKEN})
    assert resp.status_code == 303
    assert [rt.ledger.chunk(run_id, i)["state"] for i in range(3)] == ["done", "failed", "failed"]
    after = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert f"cancelled {run_id} (2 chunk(s))" in after and "cancelled, 2 not done" in after
    assert "ended, 2 failed" not in after  # before: a cancelled run read as a failed one
    assert "cancelled by the operator at " in after
    assert f"2 chunk(s) not done; &#39;farm retry-failed --run {run_id}&#39; takes it up" in after


def test_a_cancelled_run_and_its_export_date_show_as_cancelled(rt, client_for, tmp_path):
    """Before, a cancelled run showed as ``failed``; a cancelled export's date is an export
    that ended without its ``_SUCCESS`` (a ✗), not one still at work."""
    run_id = make_run(rt.ledger, done=1, failed=0, pending=1)
    export = rt.ledger.create_run("export", "farm", {"kinds": ["pins"], "date": "2031-01-02",
                                                     "dest": f"file://{tmp_path}"},
                                  [ChunkSpec("pins", {"shard": 1})])
    assert rt.ledger.cancel(run_id) == 1 and rt.ledger.cancel(export) == 1
    page = client_for(True, TOKEN).get("/").get_data(as_text=True)
    row = page[page.index(f'data-run="{run_id}"'):]
    row = row[:row.index("</tr>")]
    assert 'data-state="cancelled"' in row and "state-cancelled" in row
    assert "act-cancel" not in row and "act-pause" not in row  # it ended
    assert "act-retry-failed" in row  # 'farm retry-failed --run' takes it up again
    assert f'title="{export} cancelled">✗' in page


@pytest.mark.parametrize(("form", "status", "says"), [
    ({"action": "drop-everything"}, 400, "unknown action"),
    ({"action": "scale", "count": "many"}, 400, "bad worker count"),
    ({"action": "scale", "count": "\u00b2"}, 400, "bad worker count"),  # '²': isdigit(), not int()
    ({"action": "scale", "count": "2", "host": "a b"}, 400, "bad host"),
    ({"action": "pause", "run_id": "no-such-run"}, 409, "no run &#39;no-such-run&#39;"),
])
def test_bad_action_requests_are_one_line(rt, client_for, form, status, says):
    resp = client_for(True, TOKEN).post("/action", data={**form, "token": TOKEN})
    assert resp.status_code == status and says in resp.get_data(as_text=True)


@pytest.mark.parametrize("bind", ["localhost", "127.0.0.1:", "127.0.0.1:99999", ":9181",
                                  "127.0.0.1:http"])
def test_a_bad_bind_is_one_line_and_exit_2(farm_env, bind):
    out = run_farm(farm_env, "dashboard", "--bind", bind)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "--bind" in out.stderr and "Traceback" not in out.stderr


def test_allow_actions_without_a_token_is_exit_2(farm_env):
    env = {k: v for k, v in farm_env.items() if k != "FARM_DASHBOARD_TOKEN"}
    out = run_farm(env, "dashboard", "--allow-actions", "--bind", "127.0.0.1:1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--allow-actions needs a token" in out.stderr


def test_a_port_in_use_is_one_line_and_exit_1(farm_env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_farm(farm_env, "dashboard", "--bind", f"127.0.0.1:{port}")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert "port is in use" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("applied", ['[1]', '"text"', '{"pins": 5, "users": "x", "boards": [1], '
                                                      '"likes": true, "follows": -2}'])
def test_forged_sync_counts_do_not_break_the_page_or_metrics(rt, client_for, applied):
    """``farm sync``'s per-table counts as anyone may write them into the ledger: the page,
    its fragment and /metrics still answer (before: a 500), showing the counts that are
    counts."""
    rt.ledger.pool.execute("REPLACE INTO sync_state (name, owner, host, gtid, event_time, "
                           "applied) VALUES (%s, 'o', 'h', '0-1-5', 1, %s)", (ROW, applied))
    try:
        client = client_for()
        for path in ("/", "/fragment", "/metrics"):
            assert client.get(path).status_code == 200, path
        scraped = client.get("/metrics").get_data(as_text=True)
        shown = 'shardfarm_sync_applied_keys_total{table="pins"} 5.0' in scraped
        assert shown == applied.startswith("{")
        assert 'shardfarm_sync_applied_keys_total{table="users"}' not in scraped  # "x": no count
    finally:
        rt.ledger.pool.execute("DELETE FROM sync_state WHERE name = %s", (ROW,))
