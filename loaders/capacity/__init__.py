"""Capacity operations on whole shards: copy a shard's databases to another server pair."""
