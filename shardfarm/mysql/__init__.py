"""The MySQL layer every other one stands on: connection values (``DSN``, ``Host``),
opening a connection with least privilege and a bounded connect, translating PyMySQL
errors into the ``FarmError`` tree, connection pools, and plain single-server
connections (control, legacy). It knows nothing of shards, runs or queues.
"""
