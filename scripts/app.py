"""What a command needs, built once from ``Settings``: shard map source, router, stores."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property

from jobs.runtime import Runtime
from shardfarm.bounds import status_bound
from shardfarm.settings import Settings
from sharding.mapsource import MapSource
from sharding.router import Router


@dataclass
class App:
    """Lazily built shared objects of one CLI invocation: nothing is read or connected until
    a command asks (so a usage mistake is found before the shard map or a server is)."""

    settings: Settings
    _closers: list = field(default_factory=list)

    @cached_property
    def runtime(self) -> Runtime:
        """Router, ledger and Redis as the jobs use them, each built on first use."""
        rt = Runtime(self.settings)
        self._closers.append(rt.close)
        return rt

    @cached_property
    def viewer(self) -> Runtime:
        """A runtime for status views (``farm status``, ``runs``, ``summary``, ``failed``,
        ``quarantine``, the dashboard): its control-database statements and Redis replies
        end within FARM_STATUS_TIMEOUT (``shardfarm.bounds``)."""
        rt = Runtime(self.settings, bound=status_bound())
        self._closers.append(rt.close)
        return rt

    @cached_property
    def router(self) -> Router:
        """Pooled connections to the shard map's servers (the runtime's)."""
        return self.runtime.router

    @cached_property
    def source(self) -> MapSource:
        """The shard map, reloaded when its file changes (the router's)."""
        return self.router.source

    def close(self) -> None:
        """Release every pooled connection and shard map source, each one even if another
        fails to close."""
        with ExitStack() as stack:  # runs every callback, then raises what failed
            for close in self._closers:  # last in, first out
                stack.callback(close)
