"""``farm shards init``: create the control database and every database of the shard map."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from farmcore.preflight import ensure_control
from shardfarm.settings import Settings
from sharding.provision import ProvisionReport, init_databases, server_advice
from sharding.router import Router

# Given how many databases there are to create, a context whose value is called once per
# database created (a progress bar's ``update``).
Progress = Callable[[int], AbstractContextManager[Callable[[int], object] | None]]


@dataclass(frozen=True)
class Provisioned:
    """What ``provision`` made, and one line per server whose table caches or redo log are
    too small (or were raised)."""

    report: ProvisionReport
    advice: list[str]

    def as_dict(self) -> dict:
        """``{"shards", "mod_buckets", "servers", "seconds"}``."""
        rep = self.report
        return {"shards": rep.shards, "mod_buckets": rep.buckets, "servers": rep.servers,
                "seconds": round(rep.seconds, 2)}


def provision(settings: Settings, router: Router, *, tune: bool = False, redo: bool = True,
              progress: Progress | None = None) -> Provisioned:
    """Create the control database and every shard and mod bucket database; safe to run again.

    With ``tune`` each server's table caches are raised to fit its tables, and (with
    ``redo``) its redo log to ``sharding.provision.REDO_MIN``; ``redo=False`` leaves the redo
    log unchecked (data sets too small to need it).
    """
    ensure_control(settings.control_dsn, create=True)
    m = router.shardmap
    with (progress(m.shard_count() + m.buckets) if progress else nullcontext()) as step:
        report = init_databases(router, progress=step)
    return Provisioned(report, server_advice(router, tune, redo))
