"""The panel's FastAPI app: server-rendered pages over a read-only source, and its jobs.

Routes (every one behind the access token):

=====================================  =========================================================
``GET  /``                             the sessions: first input, pins, turns, replays, health
``GET  /s/{stream}``                   a session: its turns, labels, recipients, checkpoints
``GET  /s/{stream}/t/{turn}``          a turn, step by step (``?replay=JOB``, ``?verify=JOB``)
``POST /s/{stream}/t/{turn}/replay``   starts a re-execution; 303 to the turn page
``POST /s/{stream}/t/{turn}/verify``   starts a reconstruction and proof check; 303 likewise
``GET  /s/{stream}/calls``             a stream with no turns: its model calls (``?replay=``, …)
``POST /s/{stream}/calls/replay``      re-executes every call; 303 to the calls page
``POST /s/{stream}/calls/verify``      rebuilds every call from the record; 303 likewise
``GET  /s/{stream}/export.tar.gz``     the stream's auditor bundle, as one ``.tar.gz``
``GET  /jobs/{id}``                    a job's progress and result (JSON)
``GET  /static/{name}``                the stylesheet and the one small script
=====================================  =========================================================

Access: the token comes once in the URL the command prints (``/?token=…``); the panel answers
with a redirect to the same page without it and an HttpOnly, SameSite=Strict cookie holding a
random browser-session value (never the token; Secure on https). Anything without that cookie
(or an ``Authorization: Bearer <token>`` header) is 401. A POST is refused (403) unless it
comes from the panel's own pages: ``Sec-Fetch-Site`` same-origin (or none), ``Origin`` the
panel's own, and, with neither header, only with the Bearer token (see ``harness.panel.access``).
Templates autoescape every value, attributes included (JSON goes through the ``json`` filter,
plain text, never ``tojson``'s markup), and a Content-Security-Policy allows only the panel's
own script and stylesheet.
"""

from __future__ import annotations

import hmac
import io
import json
import secrets
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from harness.panel.access import SAFE_METHODS, BrowserSessions, cross_site_refusal
from harness.panel.fields import repro_rows
from harness.panel.jobs import Job, Jobs, run_replay, run_verify
from harness.panel.prefix import check_root
from harness.panel.source import Opened, Source, StreamRecord
from harness.panel.views import (
    NoTurn,
    TurnView,
    read_stream,
    session_row,
    session_rows,
    session_view,
    turn_view,
)
from harness.state import HomeMissing
from record.errors import UnknownStream

__all__ = ["create_app", "export_tar"]

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends ``Origin: null`` with
    # the panel's own form POSTs, which the cross-site guard must refuse
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value from the record is text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # JSON as plain text, escaped like every other value (``tojson`` is markup: its quotes
    # would end a double-quoted attribute)
    env.filters["json"] = lambda value: json.dumps(value, sort_keys=True, ensure_ascii=False)
    env.filters["short"] = lambda value, n=16: (
        value if len(str(value)) <= n else str(value)[:n] + "…"
    )
    env.filters["iso_utc"] = iso_utc
    env.globals["repro_rows"] = repro_rows
    return env


def iso_utc(stamp: str) -> str:
    """A record timestamp as ISO-8601 UTC to the second (``2026-07-22T09:30:00Z``); text
    that is no timestamp is shown as it is."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def export_tar(source: Source, stream: str) -> bytes:
    """The stream's auditor bundle directory as one gzip'd tar (``<stream>-bundle/…``)."""
    with tempfile.TemporaryDirectory(prefix="affidavit-panel-") as tmp:
        folder = source.export_to(stream, Path(tmp))
        buffer = io.BytesIO()
        top = f"{stream}-bundle"
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(folder, arcname=top, recursive=False)
            for path in sorted(folder.rglob("*")):
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue  # a bundle is plain files and folders
                if path.name.endswith(".tmp"):
                    continue
                tar.add(
                    path, arcname=f"{top}/{path.relative_to(folder).as_posix()}", recursive=False
                )
        return buffer.getvalue()


#: A redacted panel runs no replay or verify: their byte diffs would show what is redacted.
REDACTED_NO_JOBS = "this panel shows the record redacted (--redact): replay and verify are off"


def create_app(source: Source, *, token: str | None = None, root: str = "") -> FastAPI:
    """The panel over ``source``; ``app.state.token`` is the access token. ``root``: the
    path the panel is served under (``/panel`` behind the appliance's front, where ``/s/…``
    is the data plane's), which every link and redirect starts with; see
    :class:`harness.panel.prefix.Prefixed`, which routes it."""
    if root:
        check_root(root)
    token = token or secrets.token_urlsafe(32)
    # one cookie name per panel (cookies ignore the port); its value is a browser session's
    cookie = "affidavit_panel_" + secrets.token_hex(6)
    app = FastAPI(title="Affidavit panel", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.token = token
    app.state.cookie = cookie
    app.state.source = source
    browsers = BrowserSessions()
    app.state.browsers = browsers
    jobs = Jobs()
    app.state.jobs = jobs
    env = _environment()
    env.globals["root"] = root

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("refresh", False)
        context.setdefault("title", "Affidavit panel")
        html = env.get_template(name).render(
            source_text=source.describe_safe(), read_only=source.mode == "bundle", **context
        )
        # Recorded text may hold a lone surrogate (an upstream's JSON can escape one): shown
        # as its escape, never a page that fails to encode.
        return HTMLResponse(html.encode("utf-8", "backslashreplace"), status_code=status)

    def denied(reason: str) -> HTMLResponse:
        return HTMLResponse(env.get_template("denied.html").render(reason=reason), status_code=401)

    def sign_in(request: Request, given: str) -> Response:
        if not hmac.compare_digest(given.encode(), token.encode()):
            return denied("this is not the panel's access token")
        # once in the URL, then a session cookie: the token leaves the address bar
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        path = "/" + request.url.path.lstrip("/")  # never //host: no open redirect
        target = path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            cookie,
            browsers.open(),
            httponly=True,
            samesite="strict",
            path=root or "/",
            secure=request.url.scheme == "https",
        )
        return response

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        given = request.query_params.get("token")
        bearer = request.headers.get("authorization", "")
        response: Response
        if given is not None:
            response = sign_in(request, given)
        elif bearer.lower().startswith("bearer "):
            if not hmac.compare_digest(bearer[7:].strip().encode(), token.encode()):
                response = denied("this is not the panel's access token")
            else:
                response = await checked(request, call_next, bearer=True)
        elif browsers.holds(request.cookies.get(cookie, "")):
            response = await checked(request, call_next, bearer=False)
        else:
            response = denied("open the URL `affidavit panel` printed (it carries the token)")
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def checked(
        request: Request, call_next: Callable[[Request], Awaitable[Response]], *, bearer: bool
    ) -> Response:
        """An authenticated request: a POST only from the panel's own pages."""
        if request.method not in SAFE_METHODS:
            refusal = cross_site_refusal(request, bearer=bearer)
            if refusal is not None:
                return page("error.html", status=403, message=refusal, title="Refused")
        return await call_next(request)

    def missing(exc: Exception, status: int = 404) -> HTMLResponse:
        return page("error.html", status=status, message=str(exc), title="Not found")

    @app.get("/", response_class=HTMLResponse)
    def sessions() -> HTMLResponse:
        try:
            rows = session_rows(source)
        except HomeMissing as exc:
            return missing(exc, 503)
        return page("sessions.html", rows=rows, title="Sessions · Affidavit")

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        path = STATIC / name
        if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES:
            return Response("not found", status_code=404)
        if not path.is_file():
            return Response("not found", status_code=404)
        return Response(path.read_bytes(), media_type=STATIC_TYPES[path.suffix])

    @app.get("/s/{stream}", response_class=HTMLResponse)
    def session(stream: str) -> HTMLResponse:
        try:
            view = session_view(source, stream)
        except (UnknownStream, HomeMissing) as exc:
            return missing(exc)
        return page("session.html", s=view, title=f"Session {stream} · Affidavit")

    def replay_refusal(view: TurnView | None, opened: Opened | None) -> str | None:
        refusal = source.replay_refusal()
        if refusal:
            return refusal
        if opened is None or view is None:
            return "none of the panel's keys opens this stream"
        if not view.pins:
            return (
                f"turn {view.turn} was not pinned (its session has no pins): a replay is not "
                "expected to match; open a pinned session with `affidavit session new --pin …`"
            )
        if not view.strict:
            return (
                f"turn {view.turn} was pinned in shared cache mode, not strict: its replies "
                "may depend on other sessions' cache"
            )
        if view.ended is None:
            return f"turn {view.turn} has not ended: resume it first (`affidavit resume`)"
        return None

    @app.get("/s/{stream}/t/{turn}", response_class=HTMLResponse)
    def turn_page(
        stream: str, turn: int, replay: str | None = None, verify: str | None = None
    ) -> HTMLResponse:
        try:
            record, opened = read_stream(source, stream)
            row = session_row(source, stream, (record, opened))
        except (UnknownStream, HomeMissing) as exc:
            return missing(exc)
        if opened is None:
            return page(
                "sealed.html",
                status=403,
                row=row,
                stream=stream,
                turn=turn,
                title=f"Turn {turn} · sealed",
            )
        try:
            view = turn_view(record, opened, turn, row.health.problems)
        except NoTurn as exc:
            return missing(exc)
        return page(
            "turn.html",
            t=view,
            row=row,
            opened=opened,
            refusal=replay_refusal(view, opened),
            **_job_views(jobs, stream, turn, replay, verify),
            title=f"Turn {turn} of {stream} · Affidavit",
        )

    def for_job(stream: str) -> tuple[StreamRecord, Opened] | Response:
        """The stream a replay or verify job would run on, or the page that refuses it."""
        try:
            record, opened = read_stream(source, stream)
        except (UnknownStream, HomeMissing) as exc:
            return missing(exc)
        if opened is None:
            return page("error.html", status=403, message="none of the panel's keys opens it")
        if source.redaction:
            return page("error.html", status=409, message=REDACTED_NO_JOBS)
        return record, opened

    def start(stream: str, turn: int, kind: str, request: Request) -> Response:
        found = for_job(stream)
        if isinstance(found, Response):
            return found
        record, opened = found
        try:
            view = turn_view(record, opened, turn)
        except NoTurn as exc:
            return missing(exc)
        if kind == "replay":
            refusal = replay_refusal(view, opened)
            if refusal:
                return page("error.html", status=409, message=f"no replay: {refusal}")
            job = jobs.start("replay", stream, turn, lambda j: run_replay(j, source, opened))
        else:
            job = jobs.start(
                "verify", stream, turn, lambda j: run_verify(j, source, record, opened)
            )
        query = {k: v for k, v in request.query_params.items() if k in ("replay", "verify")}
        query[kind] = job.id
        return RedirectResponse(f"{root}/s/{stream}/t/{turn}?{urlencode(query)}", status_code=303)

    @app.post("/s/{stream}/t/{turn}/replay")
    def replay(stream: str, turn: int, request: Request) -> Response:
        return start(stream, turn, "replay", request)

    @app.post("/s/{stream}/t/{turn}/verify")
    def verify(stream: str, turn: int, request: Request) -> Response:
        return start(stream, turn, "verify", request)

    @app.get("/s/{stream}/calls", response_class=HTMLResponse)
    def calls_page(
        stream: str, replay: str | None = None, verify: str | None = None
    ) -> HTMLResponse:
        from harness.panel.calls import CALLS, call_rows, calls_refusal

        try:
            record, opened = read_stream(source, stream)
            row = session_row(source, stream, (record, opened))
        except (UnknownStream, HomeMissing) as exc:
            return missing(exc)
        if opened is None:
            return page("sealed.html", status=403, row=row, stream=stream, turn=0, title="sealed")
        rows = call_rows(opened)
        return page(
            "calls.html",
            stream=stream,
            rows=rows,
            opened=opened,
            refusal=calls_refusal(source, rows),
            **_job_views(jobs, stream, CALLS, replay, verify),
            title=f"Calls of {stream} · Affidavit",
        )

    def start_calls(stream: str, kind: str, request: Request) -> Response:
        from harness.panel.calls import (
            CALLS,
            call_rows,
            calls_refusal,
            run_calls_replay,
            run_calls_verify,
        )

        found = for_job(stream)
        if isinstance(found, Response):
            return found
        _, opened = found
        rows = call_rows(opened)
        if kind == "replay":
            refusal = calls_refusal(source, rows)
            if refusal:
                return page("error.html", status=409, message=f"no replay: {refusal}")
            job = jobs.start("replay", stream, CALLS, lambda j: run_calls_replay(j, source, opened))
        else:
            job = jobs.start("verify", stream, CALLS, lambda j: run_calls_verify(j, source, opened))
        query = {k: v for k, v in request.query_params.items() if k in ("replay", "verify")}
        query[kind] = job.id
        return RedirectResponse(f"{root}/s/{stream}/calls?{urlencode(query)}", status_code=303)

    @app.post("/s/{stream}/calls/replay")
    def calls_replay(stream: str, request: Request) -> Response:
        return start_calls(stream, "replay", request)

    @app.post("/s/{stream}/calls/verify")
    def calls_verify(stream: str, request: Request) -> Response:
        return start_calls(stream, "verify", request)

    @app.get("/s/{stream}/export.tar.gz")
    def export(stream: str) -> Response:
        try:
            source.record(stream)
            data = export_tar(source, stream)
        except (UnknownStream, HomeMissing) as exc:
            return missing(exc)
        name = f"{stream}-bundle.tar.gz"
        return Response(
            data,
            media_type="application/gzip",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    @app.get("/jobs/{job_id}")
    def job_json(job_id: str, wait: bool = False) -> JSONResponse:
        job = jobs.get(job_id)
        if job is None:
            return JSONResponse({"error": "no such job"}, status_code=404)
        if wait:
            jobs.wait(job)
        return JSONResponse(job.json())

    return app


def _job_views(
    jobs: Jobs, stream: str, turn: int, replay: str | None, verify: str | None
) -> dict[str, Any]:
    """What a page shows of its Replay and Verify jobs, and the query that keeps them."""
    replay_job = _job(jobs, replay, "replay", stream, turn)
    verify_job = _job(jobs, verify, "verify", stream, turn)
    keep = {k: v for k, v in (("replay", replay), ("verify", verify)) if v}
    return {
        "replay": replay_job.json() if replay_job else None,
        "verify": verify_job.json() if verify_job else None,
        "refresh": any(j is not None and j.state == "running" for j in (replay_job, verify_job)),
        "keep": lambda drop: urlencode({k: v for k, v in keep.items() if k != drop}),
    }


def _job(jobs: Jobs, job_id: str | None, kind: str, stream: str, turn: int) -> Job | None:
    job = jobs.get(job_id)
    if job is None or (job.kind, job.stream, job.turn) != (kind, stream, turn):
        return None
    return job
