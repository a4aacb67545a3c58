"""What a command needs, built once from ``Settings``: shard map source, router, stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from jobs.runtime import Runtime
from shardfarm.settings import Settings
from sharding.mapsource import ShardMapSource
from sharding.router import Router


@dataclass
class App:
    """Lazily built shared objects of one CLI invocation."""

    settings: Settings
    _closers: list = field(default_factory=list)

    @cached_property
    def source(self) -> ShardMapSource:
        """The shard map, reloaded when its file changes."""
        return ShardMapSource(self.settings.shardmap_path)

    @cached_property
    def router(self) -> Router:
        """Pooled connections to the shard map's servers."""
        router = Router(self.source)
        self._closers.append(router.close)
        return router

    @cached_property
    def runtime(self) -> Runtime:
        """Router, ledger and Redis as the jobs use them."""
        rt = Runtime(self.settings)
        rt.__dict__["router"] = self.router  # share one set of pools
        self._closers.append(rt.close)
        return rt

    def close(self) -> None:
        """Release every pooled connection."""
        for close in reversed(self._closers):
            close()
