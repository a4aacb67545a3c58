"""Helpers for the dashboard's tests: the real ``farm dashboard`` as a subprocess, HTTP."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from farmcore.ledger import ChunkSpec, Outcome
from tests.farmkit import output, spawn, stop, until
from tests.servers import free_port

TOKEN = "s3cret-dashboard-token-for-tests"


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """``(sample name, sorted labels) -> value`` of one scrape of a ``/metrics`` page."""
    status, text = get(url)
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def labels(**kw: str) -> tuple:
    """A sample's labels as ``scrape`` keys them."""
    return tuple(sorted(kw.items()))


def get(url: str, data: bytes | None = None, headers: dict | None = None
        ) -> tuple[int, str]:
    """``(status, body)`` of one request (errors included), no redirects followed."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def answers(url: str) -> bool:
    """Whether the server at ``url`` answers at all."""
    try:
        return get(url)[0] == 200
    except OSError:
        return False


@contextmanager
def dashboard(env: dict, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``farm dashboard --bind 127.0.0.1:<free port> ARGS``; yields its URL and process,
    stopped after (its output kept in ``proc.output``)."""
    port = free_port()
    proc = spawn([sys.executable, "-m", "scripts", "dashboard", "--bind", f"127.0.0.1:{port}",
                  *args], env)
    url = f"http://127.0.0.1:{port}/"
    try:
        until(lambda: proc.poll() is not None or answers(url), timeout=30,
              what="the dashboard to answer")
        assert proc.poll() is None, f"dashboard exited: {output(proc)}"
        yield url, proc
    finally:
        proc.output = stop(proc, timeout=10)


def make_run(ledger, done=1, failed=0, pending=2, rows=100, quarantined=()):
    """A run of ``done + failed + pending`` chunks of ``rows`` planned rows each, driven
    through the ledger's own claim / finish / fail."""
    n = done + failed + pending
    run_id = ledger.create_run("test", "farm", {"handler": "tests.kinds.write_edges"},
                               [ChunkSpec("edges", {"i": i}, rows=rows) for i in range(n)])
    for i in range(done + failed):
        lease = ledger.claim(run_id, i, "testhost:1:abc")
        if i < done:
            if quarantined and i == 0:
                ledger.quarantine.record(lease, list(quarantined))
            ledger.finish(lease, Outcome(rows_read=rows, rows_written=rows - len(quarantined)
                                         if i == 0 else rows,
                                         rows_quarantined=len(quarantined) if i == 0 else 0))
        else:
            ledger.fail(lease, "FatalError: bad chunk on purpose", None)
    ledger.refresh_status(run_id)
    return run_id
