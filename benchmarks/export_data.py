"""The data of the export benchmark: a private shard-host server (``Bench``), realistic pin
documents and board -> pin mappings written as TSV and loaded with ``LOAD DATA``, and a
flush of InnoDB's dirty pages so that background flushing stays out of the timings.
"""


import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pymysql
import pymysql.cursors

from benchmarks._server import ShardHostMariaDB
from sharding import ids
from sharding.schema import shard_ddl, shard_table

SHARD_1X, SHARD_10X = 1, 2
OBJECTS, MAPPING = "pins", "board_has_pins"
COLUMNS = {OBJECTS: ("local_id, data, active", "local_id"),
           MAPPING: ("from_id, to_id, sequence", "from_id, to_id")}
DATE = "2026-01-01"
GEN_SEED = 20260101
WORDS = ("recipe", "garden", "DIY", "café", "naïve", "jalapeño", "Zürich", "東京", "夏の庭",
         "🌸", "😍", "🍰", "✨", "👩\u200d🍳", "“cozy”", '"best"', "it's", "C:\\path", "tab\there",
         "two\nlines", "<b>sale</b>", "&amp;", "décor", "smørrebrød", "crème", "brûlée",
         "wedding", "ideas", "for", "the", "a", "with", "easy", "summer", "living", "room",
         "minimalist", "vintage", "outfit", "nails", "tattoo", "quotes", "travel",
         "photography", "workout", "healthy", "dinner", "2024")
SLUGS = ("recipes", "home-decor", "diy-crafts", "travel", "fashion", "weddings", "garden")


@dataclass
class Bench:
    """The private server and the temp directories of one benchmark."""

    server: ShardHostMariaDB
    workdir: Path
    outdir: Path  # the server's secure_file_priv

    def connect(self, **kwargs: object) -> pymysql.Connection:
        """A root connection to the private server (utf8mb4, autocommit)."""
        return pymysql.connect(host="127.0.0.1", port=self.server.port, user="root",
                               charset="utf8mb4", autocommit=True, **kwargs)


def say(message: str) -> None:
    """A progress line on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- data ----------------------------------------------------------------------------------


def pin_doc(rng: random.Random, shard: int, i: int) -> dict:
    """A pin-like document (~370 bytes of JSON) for local id ``i + 1``."""
    h = f"{rng.getrandbits(128):032x}"
    return {"description": " ".join(rng.choices(WORDS, k=rng.randint(4, 12))),
            "link": f"https://www.example.com/{rng.choice(SLUGS)}/{i}?utm_source=pin",
            "image": f"https://i.pinimg.example/736x/{h[:2]}/{h}.jpg",
            "board_id": ids.encode(shard, "board", 1 + i // 50),
            "pinner_id": ids.encode(shard, "user", 1 + i // 200),
            "created_at": f"20{rng.randint(12, 25)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
                          f"T{rng.randint(10, 23)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}Z",
            "repins": rng.randint(0, 5000), "likes": rng.randint(0, 900),
            "color": f"#{h[:6]}", "legacy_id": 1_000_000 + i}


def write_rows(path: Path, rows: int, line: Callable[[int], bytes]) -> None:
    """Write ``line(i)`` for ``i`` in ``range(rows)``, in blocks of 10,000 lines."""
    with open(path, "wb") as f:
        for start in range(0, rows, 10_000):
            f.write(b"".join(line(i) for i in range(start, min(rows, start + 10_000))))


def write_pins(path: Path, shard: int, rows: int) -> None:
    """A TSV file (``local_id``, JSON text, ``active``) of ``rows`` pins, for LOAD DATA."""
    rng = random.Random(GEN_SEED + shard)
    write_rows(path, rows, lambda i: b"%d\t%s\t%d\n" % (
        i + 1, orjson.dumps(pin_doc(rng, shard, i)), rng.random() >= 0.02))


def write_mappings(path: Path, shard: int, rows: int) -> None:
    """A TSV file of ``rows`` board -> pin mappings (50 pins per board)."""
    write_rows(path, rows, lambda i: b"%d\t%d\t%d\n" % (
        ids.encode(shard, "board", 1 + i // 50), ids.encode(shard, "pin", i + 1),
        1_400_000_000_000 + 997 * i))


def load(bench: Bench, shard: int, table: str, path: Path) -> None:
    """``LOAD DATA LOCAL INFILE`` of a TSV file without escapes (JSON text has no raw tabs)."""
    conn = bench.connect(local_infile=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {shard_table(shard, table)} "
                        "CHARACTER SET utf8mb4 FIELDS TERMINATED BY '\\t' ESCAPED BY '' "
                        f"({COLUMNS[table][0]})", (str(path),))
    finally:
        conn.close()


def setup(bench: Bench, rows: int) -> None:
    """Create shards 1 and 2 and fill them (N pins + N mappings, 10×N pins)."""
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            for statement in shard_ddl(SHARD_1X) + shard_ddl(SHARD_10X):
                cur.execute(statement)
    finally:
        conn.close()
    for shard, table, n, write in ((SHARD_1X, OBJECTS, rows, write_pins),
                                   (SHARD_1X, MAPPING, rows, write_mappings),
                                   (SHARD_10X, OBJECTS, 10 * rows, write_pins)):
        path = bench.workdir / f"load-{shard}-{table}.tsv"
        say(f"generating and loading {n:,} rows into {shard_table(shard, table)}")
        write(path, shard, n)
        load(bench, shard, table, path)
        path.unlink()
    settle(bench)


FLUSH_SETTINGS = {"innodb_io_capacity_max": "100000", "innodb_io_capacity": "50000",
                  "innodb_max_dirty_pages_pct": "0"}


def settle(bench: Bench, timeout: float = 300) -> None:
    """Flush InnoDB's dirty pages (flushing fast for a while) so that background flushing
    does not run during the timings; the server's settings are restored afterwards."""
    start = time.monotonic()
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT " + ", ".join(f"@@GLOBAL.{v}" for v in FLUSH_SETTINGS))
            saved = dict(zip(FLUSH_SETTINGS, cur.fetchone(), strict=True))
            for var, value in FLUSH_SETTINGS.items():
                cur.execute(f"SET GLOBAL {var} = {value}")
            dirty = wait_dirty(cur, start + timeout)
            for var in reversed(FLUSH_SETTINGS):
                cur.execute(f"SET GLOBAL {var} = {saved[var]}")
    finally:
        conn.close()
    say(f"flushed dirty pages in {time.monotonic() - start:.1f}s ({dirty} left)")


def wait_dirty(cur: pymysql.cursors.Cursor, deadline: float, most: int = 100) -> int:
    """Wait until at most ``most`` buffer pool pages are dirty (or the deadline); the count."""
    while True:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
        dirty = int(cur.fetchone()[1])
        if dirty <= most or time.monotonic() > deadline:
            return dirty
        time.sleep(0.5)
