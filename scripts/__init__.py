"""The ``farm`` command line: operators' entry point to the farm."""
