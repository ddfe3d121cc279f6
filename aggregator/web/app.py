"""The FastAPI app: ``uvicorn aggregator.app:app`` (settings from ``AGG_*`` at startup).

:func:`create_app` builds an app; the settings are read once when the lifespan starts
(unless passed in), so importing this module reads nothing. The lifespan starts the
:class:`~aggregator.service.ingest.AggregatorService` and stops it on shutdown. Routes are thin:
they read through the service and answer with the models in :mod:`aggregator.web.schemas`.

``app`` (what uvicorn loads) is built when first read, by
:func:`aggregator.web.startup.start_from_environment`: logging (``AGG_LOG_FORMAT``), settings
and the service's start happen there, so a bad setting, a corrupt checkpoint or a broker
that is down ends the process with one log line and exit 2 (or 1: the broker may come
back), not a lifespan traceback.

The dashboard lives in ``aggregator/web/static/`` (served at ``/static``); ``GET /`` serves
``static/index.html`` when it exists, else a minimal page linking the API.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import escape
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from aggregator.engine.rounds import RoundEngine
from aggregator.engine.types import AgentInfo
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import Settings, load_settings
from aggregator.web.agent_metrics import agent_samples, max_agents_from
from aggregator.web.deps import ControlAuth, MetricsDep, ServiceDep, get_service
from aggregator.web.eta import WINDOW
from aggregator.web.metrics import CONTENT_TYPE, AggregatorMetrics
from aggregator.web.schemas import (
    AgentOut,
    ControlOut,
    HealthOut,
    HistoryOut,
    RoundOut,
    StatusOut,
    TransportOut,
    eta_of,
)
from aggregator.web.startup import Standby, Started, start_from_environment
from edge_agent.links.cost import ZERO

STATIC_DIR = Path(__file__).parent / "static"

TAGS = [
    {"name": "job", "description": "Training progress, model and communication spent."},
    {"name": "agents", "description": "The agents that joined the job."},
    {"name": "control", "description": "Operator commands (bearer token required)."},
    {"name": "ops", "description": "Health and Prometheus metrics."},
]

_FALLBACK_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cat-edge aggregator</title></head>
<body><h1>cat-edge aggregator</h1>
<ul><li><a href="/status">/status</a></li><li><a href="/agents">/agents</a></li>
<li><a href="/history">/history</a></li><li><a href="/metrics">/metrics</a></li>
<li><a href="/docs">/docs</a> (OpenAPI)</li></ul></body></html>
"""

#: the dashboard's "no value yet" (an en dash, as static/index.html writes it)
_DASH = "\u2013"

router = APIRouter()


def _agent_out(service: AggregatorService, a: AgentInfo) -> AgentOut:
    """One agent, with its dense downlink baseline when known (call inside ``read``)."""
    dense = service.dense_down
    return AgentOut.build(a, None if dense is None else dense.per_agent.get(a.agent, ZERO))


@router.get("/status", tags=["job"], summary="Job state, model version, loss and cost totals")
def get_status(
    service: ServiceDep,
    target: Annotated[
        float | None,
        Query(description="Loss the ETA aims at (default: AGG_TARGET_LOSS; none: eta null)."),
    ] = None,
) -> StatusOut:
    transports = service.transports()
    version = service.read(lambda e: e.version)
    recent = service.history(max(0, version - WINDOW - 1), WINDOW + 1)
    refused = service.transport_refused()
    floor, floor_source = service.loss_floor.read()

    def build(e: RoundEngine) -> StatusOut:
        dense = service.dense_down  # read under the engine lock, like the engine
        return StatusOut.build(
            e,
            transports=transports,
            recovered_from=service.recovered_from,
            dense_down=None if dense is None else dense.total,
            now=service.now(),
            eta=eta_of(recent, target, e.config.target_loss, floor),
            loss_floor=(floor, floor_source),
            transport_refused=refused,
        )

    return service.read(build)


@router.get("/agents", tags=["agents"], summary="Every agent that has said hello")
def list_agents(service: ServiceDep) -> list[AgentOut]:
    return service.read(lambda e: [_agent_out(service, a) for a in e.agents.values()])


@router.get(
    "/agents/{agent_id}",
    tags=["agents"],
    summary="One agent",
    responses={404: {"description": "No agent with this id has said hello"}},
)
def get_agent(agent_id: str, service: ServiceDep) -> AgentOut:
    found = service.read(
        lambda e: _agent_out(service, e.agents[agent_id]) if agent_id in e.agents else None
    )
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown agent {agent_id!r}")
    return found


@router.get("/history", tags=["job"], summary="Committed rounds after version `since`")
def get_history(
    service: ServiceDep,
    # le: SQLite integers are int64; a larger value is a client error (422), not a 500
    since: Annotated[int, Query(ge=0, le=2**63 - 1, description="Return versions > since.")] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> HistoryOut:
    return HistoryOut(
        since=since, rounds=[RoundOut.build(r) for r in service.history(since, limit)]
    )


@router.get(
    "/model",
    tags=["job"],
    summary="The current model x as a .npy file (float64)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def get_model(service: ServiceDep) -> Response:
    version, blob = service.model_npy()
    return Response(
        blob,
        media_type="application/octet-stream",
        headers={
            "X-Model-Version": str(version),
            "Content-Disposition": f'attachment; filename="model-v{version}.npy"',
        },
    )


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response)
def get_metrics(metrics: MetricsDep) -> Response:
    return Response(metrics.render(), media_type=CONTENT_TYPE)


@router.get(
    "/healthz",
    tags=["ops"],
    summary="200 while ingest runs and every transport is connected, else 503 and why",
    responses={
        503: {
            "model": HealthOut,
            "description": "Ingest stopped, a transport is down, or a standby waiting",
        }
    },
)
def healthz(request: Request, response: Response) -> HealthOut:
    standby: Standby | None = request.app.state.standby
    if standby is not None and standby.waiting:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return HealthOut(
            status="standby", detail=f"standing by: AGG_DATA_DIR held by {standby.holder}"
        )
    service = get_service(request)
    transports = [TransportOut(url=u, connected=c) for u, c in service.transports()]
    down = [t.url for t in transports if not t.connected]
    if not service.healthy:
        found = HealthOut(
            status="unavailable", detail=service.fatal_error or "stopped", transports=transports
        )
    elif down:
        detail = f"transport down (reconnecting): {', '.join(down)}"
        found = HealthOut(status="degraded", detail=detail, transports=transports)
    else:
        return HealthOut(status="ok", transports=transports)
    response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return found


def _control(service: AggregatorService, cmd: Literal["pause", "resume", "stop"]) -> ControlOut:
    try:
        effects = service.control(cmd)
    except (RuntimeError, TimeoutError) as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    state, version = service.read(lambda e: (e.state, e.version))
    return ControlOut(cmd=cmd, applied=effects.changed, state=state, model_version=version)


control_router = APIRouter(
    prefix="/control",
    tags=["control"],
    dependencies=[ControlAuth],
    responses={
        401: {"description": "Missing or wrong bearer token"},
        503: {"description": "No token configured (AGG_API_TOKEN), or the service is down"},
    },
)


@control_router.post("/pause", summary="Pause training (agents are told to pause)")
def pause(service: ServiceDep) -> ControlOut:
    return _control(service, "pause")


@control_router.post("/resume", summary="Resume a paused job")
def resume(service: ServiceDep) -> ControlOut:
    return _control(service, "resume")


@control_router.post("/stop", summary="Finish the job (agents are told to stop)")
def stop(service: ServiceDep) -> ControlOut:
    return _control(service, "stop")


@router.get("/", include_in_schema=False, response_model=None)
def index(request: Request) -> HTMLResponse:
    """The dashboard with the job, state, round and live agents filled in server-side, so
    its first paint is the job as it is (the script's first poll then takes over)."""
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        return HTMLResponse(_FALLBACK_INDEX)
    service: AggregatorService | None = request.app.state.service
    return HTMLResponse(first_paint(page.read_text(encoding="utf-8"), service))


def first_paint(html: str, service: AggregatorService | None) -> str:
    """``html`` (static/index.html) with the server's view of the job in place of the
    placeholders: ``starting`` while the service is not up yet."""
    if service is None:
        filled = {"state": "starting"}
    else:
        now = get_status(service)
        filled = {
            "job": now.job,
            "state": now.state,
            "round": str(now.round),
            "live": f"{now.live_agents} / {now.agents}",  # as dashboard.js writes it
        }
    state = escape(filled.pop("state"))
    html = html.replace('data-state="unknown">connecting…<', f'data-state="{state}">{state}<', 1)
    for key, value in filled.items():
        placeholder = f'<dd id="{key}">{_DASH}</dd>'
        html = html.replace(placeholder, f'<dd id="{key}">{escape(value)}</dd>', 1)
    return html


def create_app(settings: Settings | None = None, *, started: Started | None = None) -> FastAPI:
    """Build the app. ``settings=None``: read them (env, config file) when the lifespan starts;
    ``started``: serve that running service (its settings win) and stop it on shutdown."""
    metrics = started.metrics if started is not None else AggregatorMetrics()

    def serve(app: FastAPI, service: AggregatorService) -> None:
        metrics.bind(service.metrics_snapshot, agents=lambda: service.read(agent_samples))
        app.state.service = service

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if started is not None and started.standby is not None:
            # serve /healthz (503 standby) while waiting for the data directory's lock
            standby = started.standby
            app.state.settings, app.state.standby = started.settings, standby
            standby.begin(lambda service: serve(app, service))
            try:
                yield
            finally:
                await run_in_threadpool(standby.cancel)
                metrics.bind(None)
                app.state.service = None
                await run_in_threadpool(standby.service.stop)
            return
        if started is not None:
            resolved, service = started.settings, started.service
        else:
            resolved = settings if settings is not None else load_settings()
            metrics.agents.max_agents = max_agents_from(os.environ)
            service = AggregatorService(resolved, observer=metrics.observe_round)
            await run_in_threadpool(service.start)
        app.state.settings = resolved
        serve(app, service)
        try:
            yield
        finally:
            metrics.bind(None)
            app.state.service = None
            await run_in_threadpool(service.stop)

    app = FastAPI(
        title="cat-edge aggregator",
        summary="Communication-aware adaptive tuning (CAT): rounds, model, cost accounting.",
        version="0.1.0",
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    app.state.metrics = metrics
    app.state.settings = None
    app.state.service = None
    app.state.standby = None
    app.include_router(router)
    app.include_router(control_router)
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def __getattr__(name: str) -> FastAPI:
    """``aggregator.web.app.app``: the service from the environment, started on first read."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = create_app(started=start_from_environment())
    globals()["app"] = built  # read once: later reads find the module attribute
    return built
