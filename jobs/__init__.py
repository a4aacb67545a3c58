"""Thin rq entry points and the enqueue API: JSON-safe arguments, one chunk or item batch each.

``jobs.enqueue_many(queue, function, kwargs_iterable)`` is the scripting API.
"""

from jobs.queue import EnqueueResult, enqueue_many

__all__ = ["EnqueueResult", "enqueue_many"]
