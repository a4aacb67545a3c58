"""File formats of an export part: gzip JSON Lines (the default) and Parquet (pyarrow, optional).

A format writes into any ``PartWriter`` through ``Hashed``, which counts the
bytes and computes the sha256 that the manifest records.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from types import ModuleType

from exporters.destinations import PartWriter
from shardfarm.errors import ConfigError

GZIP_LEVEL = 6  # gzip's own default: the reference the benchmark compares against
FORMATS = ("jsonl", "parquet")
EXTENSIONS = {"jsonl": "jsonl.gz", "parquet": "parquet"}
PARQUET_ROW_GROUP = 50_000


class Hashed:
    """Passes bytes on to a writer, counting them and hashing them (sha256)."""

    def __init__(self, out: PartWriter) -> None:
        self.out = out
        self.bytes = 0
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        """Pass ``data`` on to the writer, counting its bytes and hashing them."""
        if data:
            self.out.write(data)
            self.sha.update(data)
            self.bytes += len(data)

    @property
    def sha256(self) -> str:
        """Hex digest of everything written so far."""
        return self.sha.hexdigest()


class JsonlGzip:
    """JSON Lines through a streaming gzip compressor (``zlib`` with gzip framing)."""

    mode = "lines"

    def __init__(self, out: Hashed, level: int = GZIP_LEVEL) -> None:
        self.out = out
        self.z = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: gzip header and trailer

    def write_lines(self, blob: bytes) -> None:
        """Append lines that already end with ``\\n``."""
        self.out.write(self.z.compress(blob))

    def close(self) -> None:
        """Finish the gzip stream."""
        self.out.write(self.z.flush())


class _Sink:
    """A write-only file object over ``Hashed`` for pyarrow."""

    def __init__(self, out: Hashed) -> None:
        self.out, self.closed, self.pos = out, False, 0

    def write(self, data) -> int:
        b = bytes(data)
        self.out.write(b)
        self.pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def require_pyarrow() -> ModuleType:
    """pyarrow, or one clear line telling how to get it."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ConfigError("--format parquet needs pyarrow: pip install 'shardfarm[parquet]'"
                          ) from None
    return pyarrow


class Parquet:
    """Parquet through pyarrow, one row group per batch; ``data`` is a JSON text column."""

    mode = "columns"

    def __init__(self, out: Hashed, table_kind: str) -> None:
        pa = require_pyarrow()
        import pyarrow.parquet as pq
        self.pa = pa
        if table_kind == "object":
            self.schema = pa.schema([("id", pa.int64()), ("shard", pa.int32()),
                                     ("local_id", pa.int64()), ("active", pa.bool_()),
                                     ("data", pa.string())])
        else:
            self.schema = pa.schema([("from_id", pa.int64()), ("to_id", pa.int64()),
                                     ("sequence", pa.int64())])
        self.sink = pa.PythonFile(_Sink(out), mode="w")
        self.writer = pq.ParquetWriter(self.sink, self.schema, compression="zstd")

    def write_columns(self, cols: dict[str, list]) -> None:
        """Append one batch of columns as a row group."""
        pa = self.pa
        arrays = []
        for f in self.schema:
            if f.name == "data":
                arrays.append(pa.array(cols["data"], pa.binary()).cast(pa.string()))
            else:
                arrays.append(pa.array(cols[f.name], f.type))
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        """Write the footer."""
        self.writer.close()
        self.sink.close()


def check_format(fmt: str) -> str:
    """Refuse an unknown format, and Parquet without pyarrow, before a run starts."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "parquet":
        require_pyarrow()
    return fmt


def write_part(fmt: str, out: Hashed, table_kind: str,
               batches: Iterator) -> int:
    """Write every batch of a dump in ``fmt``; returns the row count."""
    rows = 0
    if fmt == "jsonl":
        w = JsonlGzip(out)
        for blob, n in batches:
            w.write_lines(blob)
            rows += n
    else:
        w = Parquet(out, table_kind)
        for cols in batches:
            w.write_columns(cols)
            rows += len(next(iter(cols.values())))
    w.close()
    return rows
