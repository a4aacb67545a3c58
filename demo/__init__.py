"""Demo and development tools: a synthetic legacy data set for trying the farm, and the
end-to-end story ``farm demo`` runs (its pipeline, report, guard and cleanup).

Nothing in the migration pipeline or the farm depends on this package.
"""
