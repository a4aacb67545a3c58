"""The farm's core: the control database's stores, the chunk context a handler works in,
and every Redis key the farm uses.

Each control table has one module that writes it: ``ledger`` (runs, chunks),
``quarantine`` (quarantine), ``mismatches`` (verify_mismatches), ``cronstate``
(cron_state); the export tables belong to ``exporters.partlog``. They share one
pool of the control database (``Ledger.pool``) and query through its retried helper.

It sits above ``sharding`` (fencing tokens, routing) and below the features
(``loaders``, ``exporters``), the queue (``jobs``), the processes (``workers``) and the CLI.
"""
