"""``farm shards move --to``: a pair the shards cannot go to (a host marked gone, a host the map
does not name, the shards' current master, one host as both master and slave) is refused in
one line with exit 2, changing nothing: no map version, no database on the target, no copy
run."""

from __future__ import annotations

import json

import pytest

from sharding.schema import shard_db
from tests.conftest import SHARDS_A, make_map_doc, run_farm

S = SHARDS_A[0]
pytestmark = pytest.mark.usefixtures("park_leftover_runs")


@pytest.fixture
def gone_map(server_b, tmp_path):
    """The test map plus OldB1 (the private server, still answering), marked gone."""
    doc = make_map_doc(server_b.port)
    doc["hosts"]["OldB1"] = dict(doc["hosts"]["TestB1"])
    doc["gone"] = ["OldB1"]
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    yield path
    for s in (S, S + 1):  # what a move that was not refused made there (the private server)
        server_b.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")


@pytest.mark.parametrize(("to", "says"), [
    ("OldB1/TestB2", "--to master OldB1 is marked gone in the shard map"),
    ("TestB1/OldB1", "--to slave OldB1 is marked gone in the shard map"),
    ("Nope/TestB2", "--to master 'Nope' is not a host of the shard map"),
    ("TestB1/Nope", "--to slave 'Nope' is not a host of the shard map"),
    ("TestA1/TestA2", f"shard {S} is already on TestA1's server"),
    ("TestB1/TestA1", f"--to slave TestA1 is the current master of shard {S}"),
    ("TestB1/TestB1", "--to TestB1/TestB1 names one host as both master and slave"),
], ids=["gone-master", "gone-slave", "unknown-master", "unknown-slave", "same-server",
        "slave-is-master", "one-host"])  # the same ids in every namespace (xdist compares)
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_move_to_a_pair_it_cannot_use_is_refused_and_changes_nothing(
        gone_map, server_b, env, ledger, to, says, dry_run):
    e = {**env, "FARM_SHARDMAP": str(gone_map)}
    before = gone_map.read_text()
    runs = ledger.runs(limit=1000)
    out = run_farm(e, "shards", "move", f"{S}-{S + 1}", "--to", to,
                   *(["--dry-run"] if dry_run else []), timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr[-2000:]
    assert gone_map.read_text() == before
    assert ledger.runs(limit=1000) == runs
    assert shard_db(S) not in {r[0] for r in server_b.sql("SHOW DATABASES")}
