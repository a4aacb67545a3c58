"""The nightly export: every shard table streamed to ``s3://`` or ``file://`` as
Hive-partitioned, compressed parts, then a manifest and ``_SUCCESS``."""
