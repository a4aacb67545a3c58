"""What a chunk handler receives: its arguments, its fencing token and the shared resources.

Handlers live in ``loaders/`` and ``exporters/``; they know nothing of rq.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from shardfarm.errors import FencedError
from shardfarm.ledger import Lease, Ledger, Outcome
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
        """Raise ``FencedError`` if the lease was lost (call between batches)."""
        if self.lost.is_set():
            raise FencedError(f"chunk {self.chunk_id} of run {self.run_id}: lease lost")
