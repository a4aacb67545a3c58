"""How long ``farm shards init`` takes for N shards (default 512) on one server.

Runs against a private mariadbd started for the measurement, so the shared
server is left alone. Usage: ``python -m benchmarks.shards_init [--shards 512]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks._server import end_on_sigterm
from sharding.mapsource import ShardMapSource
from sharding.provision import init_databases
from sharding.router import Router
from tests.servers import PrivateMariaDB


def main() -> None:
    """Create N shards plus 4096 mod buckets twice (cold, then idempotent re-run)."""
    end_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shards", type=int, default=512)
    ap.add_argument("--buckets", type=int, default=4096)
    args = ap.parse_args()
    server = PrivateMariaDB.start(buffer_pool="256M")
    try:
        host = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""}
        doc = {"version": 1, "hosts": {"A": host, "B": host},
               "shards": [{"range": [0, args.shards - 1], "master": "A", "slave": "B"}],
               "open": [], "mod": {"buckets": args.buckets,
                                   "ranges": [{"range": [0, args.buckets - 1],
                                               "master": "A", "slave": "B"}]}}
        path = Path(tempfile.mkdtemp()) / "map.json"
        path.write_text(json.dumps(doc))
        router = Router(ShardMapSource(path))
        for label in ("cold", "again"):
            t = time.monotonic()
            rep = init_databases(router)
            print(f"{label}: {rep.shards} shards + {rep.buckets} mod buckets "
                  f"in {time.monotonic() - t:.1f}s")
        router.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
