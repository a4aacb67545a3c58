"""The synthetic legacy data generator (``farm legacy generate``, ``farm demo``): a
deterministic legacy database with realistic rows (``clean``) and a small share of bad
ones (``corrupt``), bulk-loaded (``write``) and signed with who made it (``origin``).

A development and demo tool: the migration pipeline never imports it; it takes the
legacy schema from ``loaders.migration.legacy_schema``.
"""
