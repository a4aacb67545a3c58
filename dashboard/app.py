"""The dashboard's Flask application: the page, its live fragment, ``/metrics``, and the
confirm-then-act steps of the actions.

The page is plain server-rendered HTML; a few lines of script fetch ``/fragment`` every two
seconds and swap it in (without script the page still works: reload it).
"""

from __future__ import annotations

import logging
import secrets
import threading

import redis
from flask import Flask, Response, flash, get_flashed_messages, redirect, render_template, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dashboard import actions, chart, metrics
from dashboard.actions import ActionRefused, Guard
from dashboard.exports import Calendar
from dashboard.model import Reader
from farmcore import runstate
from jobs.runtime import Runtime
from shardfarm.bounds import redis_error_line
from shardfarm.errors import FarmError, RetryableError

log = logging.getLogger(__name__)
MAX_LIMIT = 200
MAX_PAGE = 1_000_000
REFRESH_MS = 2000
# Sent with every response: no other site may frame the page (a framed confirm button could
# be clicked through), and a browser takes each response as the type it says it is.
HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def create_app(rt: Runtime, guard: Guard, warm: bool = False,
               actor: Runtime | None = None) -> Flask:
    """The application over one runtime (ledger, Redis: its reads, bounded as a status view's)
    and one action guard; ``actor``: the runtime actions run with (default ``rt``; the
    dashboard gives them its command's own, unbounded like the ``farm`` command each mirrors:
    a retry of many chunks is not cut short at FARM_STATUS_TIMEOUT); ``warm``: read the
    first page's runs in the background now, so the first visitor waits less."""
    app = Flask(__name__)
    # signs the cookie that carries an action's result to the next page: the page shows only
    # what an action of this process said, not a text put in its address by anyone
    app.secret_key = secrets.token_bytes(32)
    app.config.update(SESSION_COOKIE_SAMESITE="Strict")
    reader, calendar = Reader(rt), Calendar(rt.ledger)
    if warm:
        threading.Thread(target=_warm, args=(reader,), daemon=True).start()
    registry = metrics.registry(reader, calendar)
    app.jinja_env.filters.update(num=_num, dur=chart.duration, pct=_pct)
    app.jinja_env.globals.update(svg=chart.svg, actions_on=guard.allow, refresh_ms=REFRESH_MS,
                                 max_workers=actions.MAX_WORKERS, ended=runstate.has_ended,
                                 short_ending=runstate.short_ending,
                                 cancelled_line=runstate.cancelled_line)

    def board_context() -> dict:
        limit = min(max(request.args.get("limit", 50, type=int) or 50, 1), MAX_LIMIT)
        page = min(max(request.args.get("page", 1, type=int) or 1, 1), MAX_PAGE)
        kind = request.args.get("kind") or None
        board = reader.board(limit=limit, kind=kind, offset=(page - 1) * limit)
        dates, tables, cells = calendar.grid()
        return {"board": board, "limit": limit, "page": page, "kind": kind or "",
                "dates": dates, "tables": tables, "cells": cells}

    @app.get("/")
    def index() -> str:
        note = next(iter(get_flashed_messages()), "")
        return render_template("index.html", note=note[:200], **board_context())

    @app.get("/fragment")
    def fragment() -> str:
        return render_template("live.html", **board_context())

    @app.get("/metrics")
    def scrape() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/confirm")
    def confirm() -> str | tuple[str, int]:
        if not guard.allow:
            raise ActionRefused(403, "this dashboard is read-only (start it with "
                                "--allow-actions and a token to act from it)")
        req = actions.Request.parse(request.args.to_dict())
        return render_template("confirm.html", req=req)

    @app.post("/action")
    def act() -> Response:
        guard.check(_token_of(request))
        req = actions.Request.parse(request.form.to_dict())
        done = actions.perform(actor or rt, req)
        log.info("dashboard action: %s (from %s)", done, request.remote_addr)
        flash(done)
        return redirect("/", code=303)

    _answers(app)
    return app


def _answers(app: Flask) -> None:
    """What every response carries, and how refusals and farm errors are shown."""
    @app.after_request
    def headers(resp: Response) -> Response:
        resp.headers.update(HEADERS)
        return resp

    @app.errorhandler(ActionRefused)
    def refused(exc: ActionRefused) -> tuple[str, int]:
        return render_template("refused.html", why=str(exc)), exc.status

    @app.errorhandler(redis.RedisError)
    def redis_error(exc: redis.RedisError) -> tuple[str, int]:
        return render_template("refused.html", why=redis_error_line(exc)), 503

    @app.errorhandler(FarmError)
    def farm_error(exc: FarmError) -> tuple[str, int]:
        # 503 when trying again later may work (a server that did not answer in time)
        code = 503 if isinstance(exc, RetryableError) else 409
        return render_template("refused.html", why=str(exc).splitlines()[0]), code


def _warm(reader: Reader) -> None:
    """Read the first page once; a failure here is only logged (the page says it again)."""
    try:
        reader.board()
    except (FarmError, OSError, redis.RedisError) as exc:
        log.warning("dashboard warm-up: %s", str(exc).splitlines()[0] if str(exc) else exc)


def _token_of(req) -> str | None:
    """The token of a form post, or of ``Authorization: Bearer …`` for scripts."""
    auth = req.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[len("Bearer "):]
    return req.form.get("token")


def _num(value: float | int | None) -> str:
    """``12,345`` (``–`` when unknown)."""
    return "–" if value is None else f"{value:,.0f}"


def _pct(done: float, total: float | None) -> float:
    """Percent done, 0 when the total is unknown or zero."""
    return round(100.0 * done / total, 1) if total else 0.0

