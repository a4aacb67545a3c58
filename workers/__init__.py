"""The farm's processes: the worker, the supervisor that keeps N of them per machine and
runs housekeeping, and the nightly scheduler."""
