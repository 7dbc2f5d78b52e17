"""The console's web application (Starlette, Jinja2 templates, served by uvicorn from `retrytopics console`).

    app = create_app(ConsoleOptions(...), reader)     # an ASGI app; `serve` runs it

Pages: `/` (pipeline, refreshed by /static/console.js from `/api/pipeline`), `/dlq` (the DLQ browser),
`/lineage` (one origin id), `/login` and `/actions/replay` (only with actions enabled). Safety, for pages
showing bytes that anyone with WRITE on a topic chose: templates autoescape everything; a strict
Content-Security-Policy allows scripts, styles and images from the console itself only (no inline script or
style); values are shown only on an explicit reveal (behind the session when actions are on); actions need a
session (the console's token, never sent to the browser) and the session's CSRF token, checked before the
body is read, and are logged with who, what and when; every request first passes `guard.Guard` (the Host
check, the body limits, the headers); a record that cannot be shown field by field still shows and can be
selected (`views.safe_record_view`).

Past 300 lines as one module on purpose: every route shares the page renderer, the session lookup and the
action log of one `create_app` call; split by page, each part would take all three as arguments.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Final

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from retrytopics.console import actions, views
from retrytopics.console.entries import Entry
from retrytopics.console.filters import PARAMETERS, Cursor, DlqFilter
from retrytopics.console.guard import CONTENT_SECURITY_POLICY, MAX_BODY_BYTES, Guard, is_loopback
from retrytopics.console.jobs import SparkJobs, SparkReplay, spark_replay_id
from retrytopics.console.reader import PipelineReader
from retrytopics.console.sessions import Session, Sessions
from retrytopics.core.errors import ConfigError, RetryTopicsError
from retrytopics.core.headers import DlqReason
from retrytopics.core.signing import HeaderKeys

__all__ = ["CONTENT_SECURITY_POLICY", "MAX_BODY_BYTES", "ConsoleOptions", "create_app", "is_loopback"]

log = logging.getLogger("retrytopics.console")
actions_log = logging.getLogger("retrytopics.console.actions")

_COOKIE = "retrytopics_console"
#: DLQ pages and lineage scans read at once; more wait (each holds up to a block of records per partition).
MAX_CONCURRENT_READS: Final = 2
Render = Callable[[Entry], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleOptions:
    """How the console serves: its bind host (for the Host header check), whether actions are on, and with
    which token; the app's value deserializer and header keys when an app is given."""

    host: str = "127.0.0.1"
    actions: bool = False
    token: str | None = None
    render: Render | None = None
    header_keys: HeaderKeys | None = None
    page_size: int = 50

    def __post_init__(self) -> None:
        if self.actions and not self.token:
            raise ConfigError(
                "console.token", None, "actions need a token: --token-file FILE or RETRYTOPICS_CONSOLE_TOKEN"
            )
        if not 1 <= self.page_size <= 500:
            raise ConfigError("console.page_size", self.page_size, "1 to 500")


class _Console(Starlette):
    """Starlette with `Guard` outside its error handling, so that a 500 carries the headers too."""

    def __init__(self, *, loopback: bool, **kwargs: Any) -> None:
        self._loopback = loopback
        super().__init__(**kwargs)

    def build_middleware_stack(self) -> Any:
        return Guard(super().build_middleware_stack(), loopback=self._loopback)


def _templates() -> Environment:
    folder = str(files("retrytopics.console") / "templates")
    env = Environment(loader=FileSystemLoader(folder), autoescape=True, undefined=StrictUndefined)
    env.filters["rate"] = lambda rate: "-" if rate is None else f"{rate * 100:.1f}%"
    return env


def _coordinates(values: list[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for value in values:
        partition, colon, offset = value.partition(":")
        if not colon or not _digits(partition) or not _digits(offset) or len(value) > 30:
            raise ConfigError("records", value[:32], "expected PARTITION:OFFSET")
        out.append((int(partition), int(offset)))
    return tuple(dict.fromkeys(out))


def _digits(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also takes superscripts, which `int` refuses."""
    return text.isascii() and text.isdigit()


def _pipeline_flags(reader: PipelineReader) -> list[str]:
    app = reader.pipeline
    flags = ["--topic", app.topic or "", "--group", app.group or "", "--delays", ",".join(app.delays or ())]
    return flags + (["--dlq", app.dlq] if app.dlq else [])


def create_app(options: ConsoleOptions, reader: PipelineReader) -> Starlette:
    """The console as an ASGI app over `reader`'s pipeline (the reader's tally is started by the caller)."""
    env = _templates()
    sessions = Sessions(options.token, clock=time.monotonic) if options.actions and options.token else None
    reads = asyncio.Semaphore(MAX_CONCURRENT_READS)
    spark_jobs = None
    if sessions is not None and importlib.util.find_spec("pyspark") is not None:
        spark_jobs = SparkJobs(reader.kafka, reader.topics, options.header_keys)

    def session_of(request: Request) -> Session | None:
        return None if sessions is None else sessions.get(request.cookies.get(_COOKIE))

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        session = session_of(request)
        html = env.get_template(name).render(
            topics=reader.topics,
            actions=options.actions,
            operator=session.operator if session else None,
            csrf=session.csrf if session else None,
            path=request.url.path,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def failure(request: Request, exc: RetryTopicsError) -> HTMLResponse:
        status = 400 if isinstance(exc, ConfigError) else 503
        return page(request, "error.html", status, message=f"{type(exc).__name__}: {exc}")

    async def pipeline_data() -> dict[str, Any]:
        rows = await run_in_threadpool(reader.partition_states)
        counted = await run_in_threadpool(reader.counted)
        now_ms = int(time.time() * 1000)
        data: dict[str, Any] = reader.snapshot(
            lambda tally: views.pipeline_view(rows, tally, reader.topics, now_ms=now_ms, counted=counted)
        )
        guard = await run_in_threadpool(reader.flood_guard)
        data["flood_guard"] = None if guard is None else guard.as_dict(now_ms)
        return data

    async def pipeline(request: Request) -> Response:
        try:
            data = await pipeline_data()
        except RetryTopicsError as exc:
            return failure(request, exc)
        return page(request, "pipeline.html", data=data, chart=views.chart_geometry(data["series"]))

    async def pipeline_json(request: Request) -> Response:
        try:
            return JSONResponse(await pipeline_data())
        except RetryTopicsError as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=503)

    async def chart(request: Request) -> Response:
        series = reader.snapshot(lambda tally: tally.series(int(time.time() * 1000)))
        svg = env.get_template("chart.svg").render(chart=views.chart_geometry(series))
        return Response(svg, media_type="image/svg+xml")

    async def dlq(request: Request) -> Response:
        query = {name: request.query_params.getlist(name) for name in PARAMETERS}
        session = session_of(request)
        reveal = request.query_params.get("reveal")
        if reveal and sessions is not None and session is None:  # on an actions console, values need a login
            return page(request, "error.html", 403, message="log in to reveal a value: nothing was shown")
        try:
            chosen = DlqFilter.from_query(query)
            cursor = Cursor.parse(request.query_params.get("after"))
            async with reads:
                found = await run_in_threadpool(reader.dlq_page, chosen, cursor, size=options.page_size)
        except RetryTopicsError as exc:
            return failure(request, exc)
        if reveal:
            actions_log.info(
                "console action %s",
                json.dumps(
                    {
                        "action": "reveal",
                        "record": f"{reader.topics.dlq}:{reveal[:32]}",
                        "at": views.instant(int(time.time() * 1000)),
                        "who": session.operator if session else None,
                        "from": request.client.host if request.client else None,
                    }
                ),
            )
        records = [
            views.safe_record_view(e, reveal=e.coordinates == reveal, render=options.render) for e in found.entries
        ]
        base = chosen.query()
        return page(
            request,
            "dlq.html",
            records=records,
            filter=chosen,
            filter_query=base,
            page=found,
            reasons=[r.value for r in DlqReason],
            reveal=reveal,
            next_query=None if found.next is None else [*base, ("after", found.next.text())],
            here_query=[*base, *([("after", cursor.text())] if cursor.before else [])],
        )

    async def lineage(request: Request) -> Response:
        origin_id = (request.query_params.get("id") or "").strip()
        origin, hops = None, []
        if origin_id:
            if len(origin_id) > 512:
                return failure(request, ConfigError("id", origin_id[:64], "longer than an origin id can be"))
            try:
                async with reads:
                    origin, found = await run_in_threadpool(reader.lineage, origin_id)
            except RetryTopicsError as exc:
                return failure(request, exc)
            hops = views.lineage_hops(found, reader.topics)
        return page(
            request,
            "lineage.html",
            origin_id=origin_id,
            hops=hops,
            origin=None if origin is None else views.safe_record_view(origin),
        )

    async def login(request: Request) -> Response:
        if sessions is None:
            return page(request, "error.html", 403, message="actions are off: this console is read-only")
        if request.method == "GET":
            return page(request, "login.html", problem=None)
        wait_s = sessions.login_blocked_for()
        if wait_s > 0:  # too many wrong tokens lately: refused unread, whatever this one is
            _log_action(request, None, "login refused", {"why": "too many wrong tokens"})
            refused = page(request, "login.html", 429, problem=f"too many wrong tokens: try again in {wait_s:.0f} s")
            refused.headers["retry-after"] = str(max(1, round(wait_s)))
            return refused
        form = await request.form()
        try:
            session = sessions.login(str(form.get("operator", "")), str(form.get("token", "")))
        except ConfigError as exc:
            return page(request, "login.html", 400, problem=str(exc))
        _log_action(request, None, "login", {"operator": str(form.get("operator", ""))[:64], "ok": session is not None})
        if session is None:
            return page(request, "login.html", 403, problem="wrong token")
        response = RedirectResponse("/dlq", status_code=303)
        response.set_cookie(_COOKIE, session.sid, httponly=True, samesite="strict", secure=False, path="/")
        return response

    async def logout(request: Request) -> Response:
        allowed = await authorized(request)
        if isinstance(allowed, Response):
            return allowed
        session, _ = allowed
        assert sessions is not None  # authorized: actions are on
        sessions.logout(session.sid)
        _log_action(request, session, "logout", {})
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(_COOKIE, path="/")
        return response

    async def authorized(request: Request) -> tuple[Session, FormData] | Response:
        """The session and form of an action POST, or the refusal (logged): actions off, another site's
        request, no session, or not the session's CSRF token."""
        session = session_of(request)
        if sessions is None:  # nothing here can act: the body is never read
            _log_action(request, None, "action refused", {"why": "actions are off", "path": request.url.path})
            return page(request, "error.html", 403, message="actions are off: this console is read-only")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            _log_action(request, session, "action refused", {"why": f"cross-origin request from {origin[:100]}"})
            return page(request, "error.html", 403, message="a request from another site: nothing was done")
        if session is None:
            _log_action(request, None, "action refused", {"why": "no session", "path": request.url.path})
            return page(request, "error.html", 403, message="log in first (or the form was stale): nothing was done")
        form = await request.form()
        if not session.csrf_ok(str(form.get("csrf", ""))):
            _log_action(request, session, "action refused", {"why": "no session or bad CSRF token"})
            return page(request, "error.html", 403, message="log in first (or the form was stale): nothing was done")
        return session, form

    async def replay(request: Request) -> Response:
        allowed = await authorized(request)
        if isinstance(allowed, Response):
            return allowed
        session, form = allowed
        try:
            destination = str(form.get("destination", "original"))
            if form.get("selection") == "filter":  # every record the filter matches, up to the console's limit
                query = {name: [str(v) for v in form.getlist(name)] for name in PARAMETERS}
                chosen = DlqFilter.from_query(query)
                picked, more = await run_in_threadpool(reader.matching, chosen, limit=actions.MAX_SELECTION)
                if more:
                    _log_action(request, session, "replay handed over", {"filter": chosen.query()})
                    command = actions.spark_replay_command(
                        chosen, pipeline=_pipeline_flags(reader), destination=destination
                    )
                    return page(
                        request,
                        "handover.html",
                        limit=actions.MAX_SELECTION,
                        command=command,
                        spark=spark_jobs is not None and chosen.key is None and chosen.header is None,
                        filter_query=chosen.query(),
                        destination=destination,
                    )
                form_records = [f"{p}:{o}" for p, o in picked]
            else:
                form_records = [str(v) for v in form.getlist("records")]
            coordinates = _coordinates(form_records)
            replay_id = actions.replay_id_for(destination, coordinates)
            given = str(form.get("replay_id", ""))
            if given and given != replay_id:  # the id names the selection: a typed one could reuse another's
                raise ConfigError("replay_id", given[:64], "not the replay id of these records and destination")
            request_ = actions.ReplayRequest(
                replay_id=replay_id, destination=destination, coordinates=coordinates, park=form.get("park") == "1"
            )
            dry_run = form.get("step") != "run"
            entries = await run_in_threadpool(reader.records_at, reader.topics.dlq, coordinates, whole=True)
            result = await run_in_threadpool(
                actions.run_replay,
                reader.kafka,
                reader.topics,
                entries,
                request_,
                header_keys=options.header_keys,
                dry_run=dry_run,
            )
        except RetryTopicsError as exc:
            _log_action(request, session, "replay failed", {"error": f"{type(exc).__name__}: {exc}"})
            return failure(request, exc)
        _log_action(
            request,
            session,
            "replay preview" if dry_run else "replay",
            {k: v for k, v in result.items() if k != "sample"} | {"records": [f"{p}:{o}" for p, o in coordinates]},
        )
        return page(
            request, "replay.html", result=result, records=[f"{p}:{o}" for p, o in coordinates], park=request_.park
        )

    async def spark_replay(request: Request) -> Response:
        allowed = await authorized(request)
        if isinstance(allowed, Response):
            return allowed
        session, form = allowed
        if spark_jobs is None:
            return page(request, "error.html", 400, message="the Spark replay needs the spark extra")
        try:
            chosen = DlqFilter.from_query({name: [str(v) for v in form.getlist(name)] for name in PARAMETERS})
            destination = str(form.get("destination", "original"))
            if destination not in actions.DESTINATIONS:
                raise ConfigError("destination", destination, f"expected one of {actions.DESTINATIONS}")
            job = spark_jobs.start(
                chosen,
                destination=destination,
                replay_id=spark_replay_id(chosen, destination),
                dry_run=form.get("step") != "run",
                operator=session.operator,
            )
        except RetryTopicsError as exc:
            return failure(request, exc)
        _log_action(
            request,
            session,
            "spark replay started",
            {"job": job.job_id, "replay_id": job.replay_id, "dry_run": job.dry_run, "filter": chosen.query()},
        )
        return RedirectResponse(f"/actions/jobs/{job.job_id}", status_code=303)

    def job_of(request: Request) -> SparkReplay | None:
        return None if spark_jobs is None else spark_jobs.get(str(request.path_params["job_id"]))

    async def job_page(request: Request) -> Response:
        if session_of(request) is None:
            return page(request, "error.html", 403, message="log in to follow a job")
        job = job_of(request)
        if job is None:
            return page(request, "error.html", 404, message="no such job")
        return page(
            request,
            "job.html",
            job=job,
            progress=job.progress(),
            result=job.result or {},
            filter_query=job.filter.query(),
        )

    async def job_json(request: Request) -> Response:
        if session_of(request) is None:
            return JSONResponse({"error": "log in to follow a job"}, status_code=403)
        job = job_of(request)
        if job is None:
            return JSONResponse({"error": "no such job"}, status_code=404)
        return JSONResponse({"state": job.state, "progress": job.progress()})

    def _log_action(request: Request, session: Session | None, what: str, details: dict[str, Any]) -> None:
        actions_log.info(
            "console action %s",
            json.dumps(
                {
                    "action": what,
                    "who": session.operator if session else None,
                    "at": views.instant(int(time.time() * 1000)),
                    "from": request.client.host if request.client else None,
                    **details,
                },
                sort_keys=True,
                default=str,
            ),
        )

    routes = [
        Route("/", pipeline),
        Route("/api/pipeline", pipeline_json),
        Route("/chart.svg", chart),
        Route("/dlq", dlq),
        Route("/lineage", lineage),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/actions/replay", replay, methods=["POST"]),
        Route("/actions/spark-replay", spark_replay, methods=["POST"]),
        Route("/actions/jobs/{job_id}", job_page),
        Route("/api/jobs/{job_id}", job_json),
        Mount("/static", StaticFiles(packages=[("retrytopics.console", "static")]), name="static"),
    ]
    # on loopback, a page of another site rebinding its name to 127.0.0.1 must not reach the console
    return _Console(routes=routes, loopback=is_loopback(options.host))
