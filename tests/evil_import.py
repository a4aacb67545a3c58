"""A module the workers must never import: importing it leaves a marker file.

The marker's path is ``FARM_TEST_IMPORT_MARKER``; tests name this module in jobs,
callbacks and items, and check that no worker ever imported it.
"""

import os
from pathlib import Path

if os.environ.get("FARM_TEST_IMPORT_MARKER"):
    Path(os.environ["FARM_TEST_IMPORT_MARKER"]).write_text(f"imported by {os.getpid()}\n")


def run(*args, **kwargs) -> None:
    """Would run anything it was given."""
    Path(os.environ["FARM_TEST_IMPORT_MARKER"] + ".ran").write_text(repr((args, kwargs)))
