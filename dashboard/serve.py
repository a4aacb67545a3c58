"""Serving the dashboard: ``--bind HOST:PORT`` checked in one line, then waitress (a pure
Python production WSGI server) with a few threads."""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable

from waitress import create_server

from dashboard import DEFAULT_BIND
from dashboard.actions import Guard
from dashboard.app import create_app
from jobs.runtime import Runtime
from shardfarm.errors import ConfigError, UsageError

log = logging.getLogger(__name__)
TOKEN_ENV = "FARM_DASHBOARD_TOKEN"
THREADS = 4


def parse_bind(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> ``(host, port)``; ``UsageError`` naming the flag."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"bad --bind {value!r} (expected HOST:PORT, e.g. {DEFAULT_BIND})")
    return host, int(port)


def guard_from(allow: bool, token: str | None) -> Guard:
    """The action guard from ``--allow-actions`` and ``--token`` (else ``FARM_DASHBOARD_TOKEN``)."""
    return Guard(allow=allow, token=token or os.environ.get(TOKEN_ENV) or None)


def serve(rt: Runtime, bind: str, guard: Guard, ready: Callable[[str], None] | None = None,
          actor: Runtime | None = None) -> None:
    """Serve until interrupted (pages read with ``rt``, actions done with ``actor``: see
    ``create_app``). A port in use or a host that does not resolve is one line."""
    host, port = parse_bind(bind)
    app = create_app(rt, guard, warm=True, actor=actor)
    try:
        server = create_server(app, host=host, port=port, threads=THREADS, ident="shardfarm")
    except OSError as exc:
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise ConfigError(f"cannot listen on {bind}: {why} (choose another --bind)") from None
    except (ValueError, socket.gaierror) as exc:
        raise UsageError(f"bad --bind {bind!r}: {exc}") from None
    log.info("dashboard on http://%s:%d/ (%s)", host, int(server.effective_port),
                "actions on" if guard.allow else "read-only")
    if ready:
        ready(f"http://{host}:{int(server.effective_port)}/")
    server.run()
