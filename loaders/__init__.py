"""The farm's chunk handlers that move data into and around the shards, by feature:
``migration`` (legacy database -> shards, and its verification), ``mappings`` (reverse
mapping tables, hot-board rebalancing) and ``feeds`` (Redis home feeds from the mappings).
"""
