"""The farm's core: the control database's stores (runs and chunks, quarantine, cron
state), the chunk context a handler works in, and every Redis key the farm uses.

It sits above ``sharding`` (fencing tokens, routing) and below the features
(``loaders``, ``exporters``), the queue (``jobs``), the processes (``workers``) and the CLI.
"""
