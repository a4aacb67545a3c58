"""The migration pipeline: legacy database -> sharded target, chunk by chunk.

``legacy`` reads the legacy source (whose tables ``legacy_schema`` defines), ``spec``
declares what each legacy table becomes, ``verdicts`` judges which rows migrate and
where (``when`` parses their dates), ``newids`` gives them 64-bit IDs, ``build`` makes
the target rows, ``claims`` checks who owns each object slot, ``writer`` bulk-loads
them, ``migrate`` is the chunk handler of ``farm migrate`` and ``verify`` the one of
``farm verify``.
"""
