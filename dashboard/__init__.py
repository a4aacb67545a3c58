"""The operator's window: ``farm dashboard``, a live web page of runs, workers, queues and
exports, with Prometheus metrics at ``/metrics`` and guarded actions (pause, unpause, retry
failed, scale). It reads what ``farm status`` reads; it writes only through the same
library calls the CLI's commands make."""

DEFAULT_BIND = "127.0.0.1:9181"  # where ``farm dashboard`` listens unless told otherwise
