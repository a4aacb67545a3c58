"""The sharded data model: ID codec, shard map, mod shard, schema, routing and stores.

This package knows nothing of queues, jobs or the CLI.
"""
