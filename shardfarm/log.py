"""Logging setup shared by the CLI and the workers: text for people, or one JSON object per
line for log shippers (``--log-format json`` / ``FARM_LOG_FORMAT``), with the run, chunk,
shard, host and worker a line is about when they are known.

Those fields come from ``context`` (a ``contextvars`` scope a chunk's work runs in) and
``set_process`` (the worker's name, once per process); ``setup`` puts the level and format
in the environment, so every process this one starts logs the same way. Every line's
message and traceback pass through the DSN redaction: a URL's password is never written.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from shardfarm import tuning
from shardfarm.redact import redact

FORMAT = "%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s"
HOST = socket.gethostname()

_fields: ContextVar[dict | None] = ContextVar("farm_log_fields", default=None)
_process: dict[str, object] = {}


@contextmanager
def context(**fields: object) -> Iterator[None]:
    """Lines logged inside the ``with`` block carry ``fields`` (None values are left out)."""
    token = _fields.set({**(_fields.get() or {}),
                         **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _fields.reset(token)


def set_process(**fields: object) -> None:
    """Fields every later line of this process carries (e.g. ``worker``)."""
    _process.update({k: v for k, v in fields.items() if v is not None})


def current_fields() -> dict[str, object]:
    """``host``, the process's fields and the current context's, in that order."""
    return {"host": HOST, **_process, **(_fields.get() or {})}


class RedactingFormatter(logging.Formatter):
    """The text format, with any URL's password replaced by ``***``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as text, with passwords redacted."""
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, process, the
    known context fields and, for an exception, its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line, with passwords redacted."""
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name,
               "message": redact(record.getMessage()), "process": record.process,
               **current_fields()}
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(doc, ensure_ascii=False, default=str)


def setup(level: str | None = None, fmt: str | None = None) -> None:
    """Configure the root logger: ``level`` and ``fmt`` (``text`` or ``json``) else
    ``FARM_LOG_LEVEL`` (default WARNING) and ``FARM_LOG_FORMAT`` (default text). Both are
    then set in the environment, for the processes this one starts."""
    level = str(tuning.value("FARM_LOG_LEVEL", given=level, flag="--log-level"))
    fmt = str(tuning.value("FARM_LOG_FORMAT", given=fmt, flag="--log-format"))
    os.environ["FARM_LOG_LEVEL"], os.environ["FARM_LOG_FORMAT"] = level, fmt
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else RedactingFormatter(FORMAT))
    handler.farm = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "farm", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
