"""Mapping maintenance after the migration: ``reverse`` rebuilds the reverse mapping tables
from their forward tables, ``rebalance`` spreads hot boards' mappings over several shards
through the hotspot directory."""
