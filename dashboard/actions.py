"""What an operator may do from the page: pause, unpause, cancel, retry failed, scale. Each is the
library call the matching ``farm`` command makes. Refused unless the dashboard was started
with ``--allow-actions`` and the request carries its token (compared in constant time; the
token is never logged, echoed or put in a page)."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from jobs import recovery, runs
from jobs.runtime import Runtime
from shardfarm.errors import UsageError
from workers.supervisor import MAX_WORKERS, write_desired

ACTIONS = {"pause": "Pause run", "unpause": "Unpause run", "cancel": "Cancel run",
           "retry-failed": "Retry the failed chunks of run", "scale": "Scale workers"}
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
RUN = re.compile(r"[A-Za-z0-9._:-]{1,40}")


class ActionRefused(Exception):
    """An action the dashboard will not do, with the HTTP status to answer."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class Guard:
    """Whether actions are on, and the token they need."""

    allow: bool = False
    token: str | None = None

    def __post_init__(self) -> None:
        if self.allow and not self.token:
            raise UsageError("--allow-actions needs a token: --token or FARM_DASHBOARD_TOKEN")

    def check(self, given: str | None) -> None:
        """``ActionRefused`` unless actions are on and ``given`` is the token."""
        if not self.allow:
            raise ActionRefused(403, "this dashboard is read-only (start it with "
                                "--allow-actions and a token to act from it)")
        if not given or not hmac.compare_digest(given.encode(), (self.token or "").encode()):
            raise ActionRefused(403, "wrong or missing token")


@dataclass(frozen=True)
class Request:
    """One action asked for: which, on which run, or how many workers on which host."""

    action: str
    run_id: str = ""
    count: int | None = None
    host: str = ""

    @classmethod
    def parse(cls, form: dict) -> Request:
        """From form fields; ``ActionRefused`` (400) naming the field that is wrong."""
        action = form.get("action", "")
        if action not in ACTIONS:
            raise ActionRefused(400, f"unknown action {action[:40]!r}")
        if action == "scale":
            return cls(action, count=_count(form.get("count", "")),
                       host=_match(HOST, form.get("host", "").strip(), "host", empty=True))
        return cls(action, run_id=_match(RUN, form.get("run_id", ""), "run"))

    def describe(self) -> str:
        """What will be done, in one line for the confirmation step."""
        if self.action == "scale":
            return f"Scale workers to {self.count} per supervisor on " + (
                f"host {self.host}" if self.host else "every host")
        return f"{ACTIONS[self.action]} {self.run_id}"


def _count(value: str) -> int:
    try:  # not str.isdigit(): it takes '²', which int() refuses (that was a 500)
        count = int(value)
    except ValueError:
        count = -1
    if not value.strip().isdigit() or not 0 <= count <= MAX_WORKERS:
        raise ActionRefused(400, f"bad worker count {value[:20]!r} (0 to {MAX_WORKERS})")
    return count


def _match(pattern: re.Pattern, value: str, what: str, empty: bool = False) -> str:
    if (empty and not value) or pattern.fullmatch(value):
        return value
    raise ActionRefused(400, f"bad {what} {value[:60]!r}")


def perform(rt: Runtime, req: Request) -> str:
    """Do the action (as its ``farm`` command would); returns what was done, in one line."""
    if req.action == "scale":
        write_desired(rt.redis, req.count, req.host or None)
        return req.describe().replace("Scale", "Scaled", 1)
    if req.action == "pause":
        rt.ledger.set_paused(req.run_id, True)
        return f"paused {req.run_id}"
    if req.action == "unpause":
        n = runs.unpause(rt, req.run_id)
        return f"unpaused {req.run_id} ({n} chunk(s) enqueued)"
    if req.action == "cancel":
        return f"cancelled {req.run_id} ({rt.ledger.cancel(req.run_id)} chunk(s))"
    retried = recovery.retry_failed(rt, req.run_id)
    return f"retried {req.run_id}: {retried.chunks} chunk(s) enqueued"
