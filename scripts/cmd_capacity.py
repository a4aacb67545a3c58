"""``farm shards open|move|promote|status``: grow the fleet (README "Growing the fleet")."""

from __future__ import annotations

import click

from farmcore.readonly import LeftReadOnly, ReadOnlyMasters
from loaders.capacity.move import ROWS_PER_RANGE, check_target
from scripts.app import App
from scripts.cmd_shards import shards_group
from scripts.confirm import go_ahead
from scripts.follow import wait_with_progress
from scripts.options import MAX_LAG, Seconds, emit, farm_options
from scripts.render import note
from shardfarm.errors import FarmError, FatalError, UsageError, first_line
from sharding.fleet import fleet_status, unanswered
from sharding.growth import open_range, parse_range
from sharding.promote import promote
from workers import capacity


@shards_group.command("open")
@click.argument("shards", metavar="LO-HI")
@click.option("--master", required=True, help="Host of the shard map that will hold the range.")
@click.option("--slave", required=True, help="Its slave (a host of the shard map).")
@click.option("--weight", type=click.IntRange(1, 1_000_000), default=None,
              help="The range's share of new users against the other open ranges' "
                   "(default: its number of shards).")
@farm_options
def open_cmd(app: App, shards: str, master: str, slave: str, weight: int | None) -> None:
    """Create shards LO..HI on MASTER and open them to new users (map version + 1)."""
    lo, hi = parse_range(shards)
    done = open_range(app.router, app.settings.shardmap_spec, lo, hi, master, slave, weight,
                      app.settings.connect_timeout)
    emit({"opened": [done.lo, done.hi], "master": done.master, "slave": done.slave,
          "weight": done.weight, "version": done.version})


def _pair(text: str) -> tuple[str, str]:
    master, sep, slave = text.partition("/")
    if not sep or not master or not slave:
        raise UsageError(f"bad --to {text[:60]!r} (expected MASTER/SLAVE, two hosts of the map)")
    return master, slave


@shards_group.command("move")
@click.argument("shards", metavar="LO-HI")
@click.option("--to", "to", required=True, metavar="MASTER/SLAVE",
              help="The new pair: two hosts of the shard map.")
@click.option("--wait", is_flag=True, help="Show the copy's progress until it ends.")
@click.option("--rows-per-chunk", default=ROWS_PER_RANGE, show_default=True,
              type=click.IntRange(min=1000),
              help="Rows per copy chunk, also the range the catch-up copies again whole if it "
                   "changed (smaller: a shorter freeze under heavy writes, a slower copy).")
@MAX_LAG
@click.option("--drop-source", is_flag=True,
              help="After the flip and --grace seconds, drop the source copies.")
@click.option("--grace", default=30.0, show_default=True, type=Seconds(min=0),
              help="Seconds between the flip and dropping the source copies.")
@click.option("--dry-run", is_flag=True,
              help="Check the move and print what it would do (with --drop-source, the source "
                   "copies it would drop too); change nothing.")
@click.option("--yes", is_flag=True, help="With --drop-source: do not ask.")
@farm_options
def move_cmd(app: App, shards: str, to: str, wait: bool, rows_per_chunk: int,
             max_lag: float | None, drop_source: bool, grace: float, dry_run: bool,
             yes: bool) -> None:
    """Copy shards LO..HI to the pair MASTER/SLAVE through the farm, catch up, verify,
    and flip the map (version + 1); workers ('farm workers') do the copying.

    Writes to those shards pause for the last catch-up (sharding/ stores get a retryable
    error meanwhile). Prints a JSON summary as the last line.
    """
    lo, hi = parse_range(shards)
    master, slave = _pair(to)
    if yes and not drop_source:
        raise UsageError("--yes goes with --drop-source")
    check_target(app.router.shardmap, lo, hi, master, slave)  # before asking anything
    if dry_run:
        emit(capacity.preview(app.runtime, lo, hi, master, slave,
                              rows_per_range=rows_per_chunk, drop_source=drop_source))
        return
    if drop_source:  # asked before the move, not at its end
        what = f"drop the source copies of shards {lo}-{hi} after the move"
        go_ahead(lambda: ([what], {"drop_source": [lo, hi]}), dry_run=False, yes=yes,
                 question="Move, then drop them?", refuse_off_terminal=True)
    rt = app.runtime
    follow = (lambda run_id: wait_with_progress(rt, run_id)) if wait else None
    summary, plan = capacity.move(rt, lo, hi, master, slave, rows_per_range=rows_per_chunk,
                                  follow=follow, max_lag=max_lag, notice=note)
    if drop_source:
        summary["dropped"] = capacity.drop_sources(rt, plan, grace, notice=note)
    emit(summary)


@shards_group.command("promote")
@click.argument("host")
@click.option("--accept-loss", is_flag=True,
              help="Promote even if HOST has not applied everything its master sent.")
@click.option("--wait-seconds", default=10.0, show_default=True, type=Seconds(min=0),
              help="How long to let HOST apply the relay log it already received.")
@farm_options
def promote_cmd(app: App, host: str, accept_loss: bool, wait_seconds: float) -> None:
    """Make the slave HOST the master of its dead master's ranges (map version + 1)."""
    done = promote(app.router, app.settings.shardmap_spec, host,
                   ReadOnlyMasters(app.runtime.ledger.pool), accept_loss, wait_seconds,
                   app.settings.connect_timeout)
    if done.already:
        note(f"{host} was already promoted in map version {done.version}; it is master and "
             "writable, nothing else to do")
        emit({"promoted": done.host, "already_promoted": True, "version": done.version})
        return
    if done.lost:
        note(f"{host} was promoted without everything {done.old_master} sent (--accept-loss)")
    note(f"{done.old_master} is marked gone; provision a new slave of {host} (a copy of it "
         f"replicating from it by GTID) and publish a map that names it as the slave")
    emit({"promoted": done.host, "old_master": done.old_master, "version": done.version,
          "gtid_applied": done.applied, "gtid_received": done.received,
          "accepted_loss": done.lost})


@shards_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@farm_options
def status_cmd(app: App, as_json: bool) -> None:
    """Per host of the map: role, shards, replication lag, read-only, map version told; then
    every master an unfinished promote may have left read-only, with the command that
    finishes it. Exit 1 after all that, in one line, when a host of the map does not answer
    (but one it marks gone) or the control database cannot be read."""
    doc = fleet_status(app.router)
    left, failed = _left_read_only(app, doc)
    doc["unfinished_promotes"] = [r.as_dict() for r in left]
    if as_json:
        emit(doc)
    else:
        click.echo(f"shard map version {doc['version']}")
        for h in doc["hosts"]:
            click.echo(status_line(h))
        for r in left:
            click.echo(f"UNFINISHED PROMOTE: {r.line()}")
    problems = []
    if down := unanswered(doc):
        problems.append(f"{len(down)} host(s) of the map do not answer: "
                        f"{', '.join(down[:10])}{' …' * (len(down) > 10)} (their entries "
                        "above say why; a host the map marks gone is not counted)")
    if failed is not None:
        problems.append("cannot list the masters an unfinished promote left read-only "
                        f"(control database: {first_line(failed)})")
    if problems:
        raise FatalError("; ".join(problems))


def _left_read_only(app: App, doc: dict) -> tuple[list[LeftReadOnly], FarmError | None]:
    """The masters an unfinished promote recorded that are still read-only (or do not
    answer: they may be) in the fleet status ``doc``; and the error if the control database
    could not be read. A master that takes writes again (undone by hand) is left out."""
    try:
        found = ReadOnlyMasters(app.viewer.ledger.pool).listed()
    except FarmError as exc:
        return [], exc
    hosts = {h["host"]: h for h in doc["hosts"]}
    return [r for r in found if r.master not in hosts or not hosts[r.master]["reachable"]
            or hosts[r.master]["read_only"]], None


def status_line(h: dict) -> str:
    """One host of ``farm shards status`` as a line of text."""
    def spans(ranges: list) -> str:
        return ",".join(f"{lo}-{hi}" for lo, hi in ranges) or "-"
    head = f"{h['host']:<12} {h['address']:<22} {h['role']:<7}"
    shards = f"master {spans(h['master_of'])}  slave {spans(h['slave_of'])}"
    if not h["reachable"]:
        return f"{head} {shards}  UNREACHABLE: {h['error']}"
    lag = "-" if h["lag_seconds"] is None else h["lag_seconds"]
    told = "-" if h["map_version"] is None else f"v{h['map_version']}"
    return (f"{head} {shards}  lag {lag}  read-only {'yes' if h['read_only'] else 'no'}  "
            f"told {told}")
