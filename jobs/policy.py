"""Which code a worker may run, decided from a name before anything is imported.

Whoever can write to Redis (or the control database) can name any function; a
worker runs only:

- the farm's own rq entry point (``jobs.items.run_items``, the envelope every
  farm job is), whose items call
- the farm's own item function (``jobs.chunk.run_chunk``) or a function of a
  module prefix the operator allows (``FARM_JOB_MODULES``, comma-separated, or
  ``--allow-module`` on ``farm workers`` / ``farm enqueue``);
- and, for a run's chunks, the farm's own chunk handlers or a function of an
  allowed prefix.

A name is refused on its text (shape, prefix) before its module is imported;
once imported, the object must be callable and defined under an allowed prefix
(a function merely imported into an allowed module, such as ``os.system``, is
not that module's function).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shardfarm.errors import FatalError

ENV = "FARM_JOB_MODULES"
ENTRY_POINT = "jobs.items.run_items"
CHUNK_FUNCTION = "jobs.chunk.run_chunk"
# The chunk handlers of the farm's own runs (each module's ``HANDLER``; a test checks they
# agree), named as text: checking a run's handler imports nothing but that handler's module.
FARM_HANDLERS = frozenset({
    "loaders.migration.migrate.load_chunk", "loaders.migration.verify.verify_chunk",
    "loaders.mappings.reverse.reverse_chunk", "loaders.mappings.rebalance.rebalance_board",
    "loaders.feeds.rebuild_chunk", "exporters.export.export_chunk",
    "loaders.capacity.copy.copy_chunk"})
# Runs record their handler by name in the control database: a run started before the
# handlers moved still names the old module, and is served by the same function.
RENAMED_HANDLERS = {
    "loaders.migrate.load_chunk": "loaders.migration.migrate.load_chunk",
    "loaders.verify.verify_chunk": "loaders.migration.verify.verify_chunk",
    "loaders.reverse.reverse_chunk": "loaders.mappings.reverse.reverse_chunk",
    "loaders.rebalance.rebalance_board": "loaders.mappings.rebalance.rebalance_board",
}
_DOTTED = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*$")


class ForbiddenJobError(FatalError):
    """A job names code the workers are not allowed to run (refused before any import)."""


def parse_modules(values: Iterable[str]) -> tuple[str, ...]:
    """Module prefixes from comma-separated texts; a malformed one is a one-line error."""
    out: list[str] = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if not _DOTTED.match(part):
                raise ForbiddenJobError(f"bad module prefix {part!r} in {ENV} / --allow-module "
                                        "(expected dotted names such as 'mycompany.jobs')")
            out.append(part)
    return tuple(dict.fromkeys(out))


def add_operator_path() -> None:
    """Let the operator's own job modules in the working directory import (like rq's
    ``--path .``): the directory goes last on ``sys.path``, so that a folder there named
    like one of the farm's packages (``workers/``, ``jobs/``) cannot stand in for it."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)


@dataclass(frozen=True)
class JobPolicy:
    """The operator's allowed module prefixes, plus the farm's own code."""

    modules: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 flags: Iterable[str] = ()) -> JobPolicy:
        """``--allow-module`` flags when given (they override), else ``FARM_JOB_MODULES``."""
        flags = list(flags)
        env = os.environ if env is None else env
        return cls(parse_modules(flags) if flags else parse_modules([env.get(ENV, "")]))

    def env_value(self) -> str:
        """The ``FARM_JOB_MODULES`` value that gives a child process this policy."""
        return ",".join(self.modules)

    def _allowed(self, dotted: str) -> bool:
        return any(dotted == p or dotted.startswith(p + ".") for p in self.modules)

    def _refuse(self, dotted: object, own: Iterable[str], what: str) -> str | None:
        if not isinstance(dotted, str) or not _DOTTED.match(dotted) or "." not in dotted:
            return f"{what} {str(dotted)[:120]!r} is not a dotted module.function name"
        if dotted in own or self._allowed(dotted):
            return None
        allowed = ", ".join(self.modules) or "none"
        return (f"{what} {dotted!r} is not allowed: workers run the farm's own code and "
                f"functions of {ENV} / --allow-module (now: {allowed})")

    def item_refusal(self, dotted: object) -> str | None:
        """Why an item function may not run (``None``: it may)."""
        return self._refuse(dotted, (CHUNK_FUNCTION,), "function")

    def handler_refusal(self, dotted: object) -> str | None:
        """Why a run's chunk handler may not run (``None``: it may)."""
        if isinstance(dotted, str):
            dotted = RENAMED_HANDLERS.get(dotted, dotted)
        return self._refuse(dotted, FARM_HANDLERS, "chunk handler")

    def load_item(self, dotted: str) -> Callable:
        """The item function ``dotted``, checked before and after import."""
        return self._load(dotted, self.item_refusal(dotted), CHUNK_FUNCTION)

    def load_handler(self, dotted: str) -> Callable:
        """The chunk handler ``dotted`` (under its current name if it moved), checked before
        and after import."""
        dotted = RENAMED_HANDLERS.get(dotted, dotted)
        return self._load(dotted, self.handler_refusal(dotted), *FARM_HANDLERS)

    def _load(self, dotted: str, refusal: str | None, *own: str) -> Callable:
        if refusal:
            raise ForbiddenJobError(refusal)
        module_name, _, name = dotted.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module_name), name, None)
        except ImportError as exc:
            raise FatalError(f"cannot import {dotted!r}: {exc}") from None
        if not callable(fn):
            raise FatalError(f"{dotted!r} is not a function (expected module.function)")
        real = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', name)}"
        if dotted not in own and not self._allowed(real):
            raise ForbiddenJobError(f"{dotted!r} is {real}, which is not under an allowed "
                                    f"prefix of {ENV}")
        return fn
