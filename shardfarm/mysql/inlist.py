"""How many values an ``IN (...)`` list may hold.

MariaDB turns a list of ``in_predicate_conversion_threshold`` values or more (1,000 by
default) into a join with a table of the values, which the optimizer may answer by
reading the whole table (a shard's boards, say) instead of one index look-up per value.
Lists of at most ``IN_LIST_MAX`` values stay plain index look-ups.
"""

IN_LIST_MAX = 999
