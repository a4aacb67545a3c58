"""Python's cyclic garbage collector held off while a migration chunk's rows are in memory.

A migration chunk builds hundreds of thousands of small dicts and tuples that live until
it ends and form no cycles; the collector would rescan them again and again as they pile
up (its full collections run each time the surviving objects grew by a quarter).
Reference counting still frees everything as usual; what the collector would find is
found after the chunk.
Measured on a 10x migration, 100k-row chunks: workers' CPU 53.9 s -> 49.9 s. Only where
measured: other chunk kinds (an export's S3 client, say) may make cycles of their own.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_off() -> Iterator[None]:
    """Run the block with the cyclic collector off, then restore it as it was (on or off),
    whatever the block raised."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
