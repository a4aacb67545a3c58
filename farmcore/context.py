"""What a chunk handler receives: its arguments, its fencing token and the shared resources.

Handlers live in ``loaders/`` and ``exporters/``; they know nothing of rq.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from farmcore.ledger import Lease, Ledger, Outcome
from shardfarm.errors import ChunkTimeoutError, FencedError
from shardfarm.settings import Settings
from sharding.fencing import FenceToken
from sharding.router import Router


@dataclass
class ChunkContext:
    """One running chunk: ``lease`` says which, ``router`` reaches the shards."""

    settings: Settings
    router: Router
    ledger: Ledger
    lease: Lease
    params: dict
    redis: Any = None
    lost: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome = field(default_factory=Outcome)
    time_limit: float | None = None  # time.monotonic() by which the attempt must end
    lease_seconds: float = 60.0
    deadline: float = math.inf  # time.monotonic() by which the lease may have expired
    renewed: float = -math.inf  # time.monotonic() when the last renewal was sent

    def extended(self, since: float) -> None:
        """The lease was renewed by a statement sent at ``since`` (``time.monotonic()``):
        it holds until ``since + lease_seconds`` at least; stop a margin before that."""
        self.deadline = since + self.lease_seconds - min(5.0, self.lease_seconds / 5)
        self.renewed = max(self.renewed, since)

    @property
    def token(self) -> FenceToken:
        """The fencing token every shard write of this chunk carries."""
        return self.lease.token

    @property
    def run_id(self) -> str:
        """The run this chunk belongs to."""
        return self.lease.run_id

    @property
    def chunk_id(self) -> int:
        """This chunk's number within its run."""
        return self.lease.chunk_id

    def check(self) -> None:
        """Between batches: ``FencedError`` if the lease was lost or may have expired (the
        renewer was fenced out, or could not renew it in time), ``ChunkTimeoutError`` if the
        attempt's time is up (it ends cleanly and is tried again with more time)."""
        if self.lost.is_set() or time.monotonic() >= self.deadline:
            self.lost.set()
            raise FencedError(f"chunk {self.chunk_id} of run {self.run_id}: lease lost")
        if self.time_limit is not None and time.monotonic() > self.time_limit:
            raise ChunkTimeoutError(f"chunk {self.chunk_id} of run {self.run_id} ran out of "
                                    "its job's time")

    def fence(self) -> None:
        """Prove the lease is still this attempt's, right before a result becomes visible.

        Renews it in the control database (a compare-and-set on the fence): on return
        no other attempt can take the chunk for ``lease_seconds``, so the step that
        follows at once (a rename, a multipart completion) cannot land after a
        successor's. ``FencedError`` if it was taken over or lost.
        """
        self.check()
        self.renew()

    def fence_fresh(self, within: float = 1.0) -> None:
        """``fence()``, unless a renewal was sent less than ``within`` seconds ago: then that
        renewal is the proof (no other attempt can take the chunk before it ends) and only
        ``check()`` runs. For a group of parts made visible one after the other."""
        if time.monotonic() - self.renewed < within:
            self.check()
        else:
            self.fence()

    def renew(self) -> None:
        """Renew the lease for ``lease_seconds`` from now (the deadline moves with it);
        ``FencedError``, and ``lost`` set, if another attempt took the chunk over."""
        since = time.monotonic()
        try:
            self.ledger.renew(self.lease, self.lease_seconds)
        except FencedError:
            self.lost.set()
            raise
        self.extended(since)
