"""Logging setup shared by the CLI and the workers."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s"


def setup(level: str | None = None) -> None:
    """Configure the root logger once; ``FARM_LOG_LEVEL`` sets the default level."""
    level = (level or os.environ.get("FARM_LOG_LEVEL") or "WARNING").upper()
    logging.basicConfig(level=level, format=FORMAT)
    logging.getLogger().setLevel(level)
