"""Where a private server's statement time went: performance_schema statement digests,
grouped over shards and buckets (``db00012``/``mod00345`` read as one name).

Instrumenting costs the server time of its own, so a benchmark reports digests from a
run made for them (``--digests``), never next to its timed ratios.
"""

from __future__ import annotations

import re
from collections import defaultdict

from tests.servers import PrivateMariaDB

SERVER_OPTIONS = {"performance_schema": "ON", "performance_schema_digests_size": "200000",
                  "performance_schema_max_digest_length": "300"}
_NUMBERED = re.compile(r"`(db|mod)\d+`")
_LISTS = re.compile(r"\(\?(, \?)*\)|\?(, \?)+")


def reset(server: PrivateMariaDB) -> None:
    """Forget the statements seen so far."""
    server.sql("TRUNCATE performance_schema.events_statements_summary_by_digest")


def shares(server: PrivateMariaDB, top: int = 30) -> tuple[float, list[tuple[str, int, float]]]:
    """Total statement seconds since ``reset``, and the ``top`` statement shapes by time:
    ``(shape, statements, seconds)``."""
    by_shape: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for text, count, ps in server.sql(
            "SELECT DIGEST_TEXT, COUNT_STAR, SUM_TIMER_WAIT FROM "
            "performance_schema.events_statements_summary_by_digest"):
        shape = _LISTS.sub("(...)", _NUMBERED.sub(r"`\1N`", str(text or "(other)")))[:110]
        by_shape[shape][0] += int(count)
        by_shape[shape][1] += int(ps) / 1e12
    total = sum(v[1] for v in by_shape.values())
    ranked = sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:top]
    return total, [(k, int(v[0]), v[1]) for k, v in ranked]


def report(label: str, server: PrivateMariaDB) -> None:
    """Print the statement shapes that took most of the server's statement time."""
    total, ranked = shares(server)
    print(f"\n{label}: {total:.1f} statement seconds on the server; by statement shape:")
    for shape, count, seconds in ranked:
        print(f"  {100 * seconds / total if total else 0:5.1f}% {seconds:7.1f}s "
              f"{count:>9,}  {shape}")
