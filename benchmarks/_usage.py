"""What a benchmark's processes used: CPU seconds and peak memory, read from ``/proc``."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Usage:
    """CPU seconds of the server and of the workers during a run, the workers' peak RSS."""

    server_cpu: float
    workers_cpu: float
    workers_peak_mib: float
    table_opens: int | None = None  # tables the server opened meanwhile (``Opened_tables``)
    legacy_cpu: float | None = None  # the legacy database's own server, if it has one

    def __str__(self) -> str:
        opens = "" if self.table_opens is None else f"; server table opens {self.table_opens:,}"
        legacy = "" if self.legacy_cpu is None else f", legacy server {self.legacy_cpu:.1f}"
        return (f"CPU seconds: server {self.server_cpu:.1f}{legacy}, "
                f"workers {self.workers_cpu:.1f}; "
                f"worker peak RSS {self.workers_peak_mib:.0f} MiB{opens}")


def _stat_seconds(stat: Path) -> float:
    """User + system CPU seconds in a ``/proc`` ``stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/PID/stat``)."""
    return _stat_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of a process so far, by thread ID (a
    thread that ends meanwhile is skipped)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _stat_seconds(task / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (a worker supervisor's: its workers)."""
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def workers_cpu(supervisor: int) -> float:
    """CPU seconds the supervisor's workers have used so far."""
    return sum(cpu_seconds(p) for p in children(supervisor))


def workers_peak(supervisor: int) -> float:
    """The largest peak RSS (``VmHWM``) of the supervisor's workers, MiB."""
    peaks = [0.0]
    for p in children(supervisor):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks)


def children_cpu() -> float:
    """CPU seconds of the waited-for child processes so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
