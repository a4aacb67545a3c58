"""Worker "machines" as network namespaces: each has its own network stack, host name and
address, linked to the root namespace by a veth pair on a bridge.

``NetLab.build(ns, machines)`` makes a bridge ``farm{ns}br`` in the root namespace with
address ``10.77.{ns}.1/24`` and, per machine ``m1`` … ``mK``, a namespace ``farm{ns}m{i}``
whose veth end has ``10.77.{ns}.{10+i}``. Servers the machines use are started bound to
the bridge address (``lab.gateway``), never 127.0.0.1, so a machine reaches them over its
own link only: ``lab.cut(m)`` (``ip link set … down`` on the root side) isolates it with
its processes still running, ``lab.restore(m)`` reconnects it (TCP connections resume).
``lab.popen(m, argv)`` runs a command inside machine ``m`` under host name ``m`` (its own
UTS namespace, so ``socket.gethostname()`` there is ``m``). Needs root and iproute2; when
the kernel refuses, ``NetLabError`` says so (the tests fail on it, they never skip).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field

IP = "ip"


class NetLabError(RuntimeError):
    """The environment refused to create namespaces, links or addresses."""


def ip(*args: str) -> None:
    """Run ``ip ARGS``; ``NetLabError`` with its message if it fails."""
    try:
        proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise NetLabError("iproute2 ('ip') is not installed: apt-get install -y iproute2"
                          ) from exc
    if proc.returncode != 0:
        raise NetLabError(f"'ip {' '.join(args)}' failed: {proc.stderr.strip()} "
                          "(network namespaces need root and CAP_NET_ADMIN)")


@dataclass
class NetLab:
    """A bridge in the root namespace and K machine namespaces linked to it."""

    ns: int
    machines: list[str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        """The bridge's interface name."""
        return f"farm{self.ns}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: servers listen here."""
        return f"10.77.{self.ns}.1"

    def address(self, machine: str) -> str:
        """Machine ``mI``'s own address."""
        return f"10.77.{self.ns}.{10 + self._index(machine)}"

    def netns(self, machine: str) -> str:
        """The namespace's name of ``machine``."""
        return f"farm{self.ns}{machine}"

    def host_side(self, machine: str) -> str:
        """The root-namespace end of ``machine``'s link (what ``cut`` takes down)."""
        return f"f{self.ns}h{self._index(machine)}"

    def _index(self, machine: str) -> int:
        return self.machines.index(machine) + 1

    @classmethod
    def build(cls, ns: int, count: int = 3) -> NetLab:
        """Create the bridge and ``count`` machines (leftovers of a killed run first go)."""
        lab = cls(ns, [f"m{i}" for i in range(1, count + 1)])
        lab.teardown()
        try:
            ip("link", "add", lab.bridge, "type", "bridge")
            ip("addr", "add", f"{lab.gateway}/24", "dev", lab.bridge)
            ip("link", "set", lab.bridge, "up")
            for m in lab.machines:
                lab._add_machine(m)
        except NetLabError:
            lab.teardown()
            raise
        return lab

    def _add_machine(self, m: str) -> None:
        inside, outside = f"f{self.ns}m{self._index(m)}", self.host_side(m)
        ip("netns", "add", self.netns(m))
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", self.netns(m))
        ip("link", "set", outside, "master", self.bridge)
        ip("link", "set", outside, "up")
        ip("-n", self.netns(m), "addr", "add", f"{self.address(m)}/24", "dev", inside)
        ip("-n", self.netns(m), "link", "set", inside, "up")
        ip("-n", self.netns(m), "link", "set", "lo", "up")

    def cut(self, machine: str) -> None:
        """Take ``machine``'s link down: its packets go nowhere, its processes run on."""
        ip("link", "set", self.host_side(machine), "down")

    def restore(self, machine: str) -> None:
        """Bring ``machine``'s link back up."""
        ip("link", "set", self.host_side(machine), "up")
        ip("link", "set", self.host_side(machine), "master", self.bridge)

    def argv(self, machine: str, argv: list[str]) -> list[str]:
        """``argv`` as run inside ``machine``, with host name ``machine``."""
        return [IP, "netns", "exec", self.netns(machine), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', machine, *argv]

    def popen(self, machine: str, argv: list[str], **kwargs: object) -> subprocess.Popen:
        """Start ``argv`` inside ``machine`` in a process group of its own (``teardown``
        kills the whole group: a supervisor's workers too)."""
        proc = subprocess.Popen(self.argv(machine, argv), start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, machine: str, argv: list[str], timeout: float = 60
            ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``machine`` to the end."""
        return subprocess.run(self.argv(machine, argv), capture_output=True, text=True,
                              timeout=timeout)

    def teardown(self) -> None:
        """Kill what ``popen`` started, delete the namespaces and the bridge (quietly: some
        may not exist)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for m in self.machines:
            subprocess.run([IP, "netns", "del", self.netns(m)], capture_output=True)
            subprocess.run([IP, "link", "del", self.host_side(m)], capture_output=True)
        subprocess.run([IP, "link", "del", self.bridge], capture_output=True)
