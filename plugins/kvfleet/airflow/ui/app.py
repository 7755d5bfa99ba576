"""The kvfleet page: a FastAPI app that Airflow's API server mounts at ``/kvfleet`` (the plugin's ``fastapi_apps``).

Routes (relative to the mount point):

- ``/`` -> ``/fleet``; ``/fleet``, ``/trends``, ``/advisor``, ``/drift``, ``/curvine``, ``/gates``, ``/runs``: HTML
  views (``/advisor``: the L2 advisor's newest report per cluster, with each endpoint's prompt-length
  distribution against the payoff threshold and its verdict's arithmetic);
- ``/gates`` (and ``/api/gates``) also lists the gates waiting for a human now (read from Airflow's HITL
  records, ``kvfleet.airflow.hitl.pending``), each with its run's evidence and a link to Airflow's Required
  Actions page, where it is answered;
- ``/metrics``: kvfleet's own metrics in Prometheus' text format, read from the history and Airflow's HITL records
  (``kvfleet.airflow.ui.metrics``, ``docs/metrics.md``); Prometheus scrapes it with an Airflow user's JWT as its
  bearer token, and gets 401/403, never a login redirect;
- ``/runbook``: the operator's runbook (``docs/runbook.md``), or a redirect to ``KVFLEET_RUNBOOK_URL``;
- ``/api/openapi.json``: the app's OpenAPI schema (no /docs or /redoc page);
- ``/api/<view>``: the same view's data as JSON; ``/api/queries``: the named queries the page may run, with
  their parameters; ``/api/queries/<name>``: one named query's rows (parameters from the query string).

It reads only the kvfleet history, through the named queries in ``sql/queries/`` (``Queries.rows``, as the CLI
does). Auth is Airflow's: the caller is the user of the JWT in the ``Authorization: Bearer`` header or the UI's
``_token`` cookie, resolved by Airflow's own ``get_user`` dependency against the auth manager the API server
initialised, and must be allowed to read DAG runs (on every route, the schema's included). An HTML request without a
valid user is redirected to the auth manager's login page (which comes back here); an API request gets 401 (no or
expired token) or 403.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from alembic.util.exc import CommandError as AlembicError
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError

from kvfleet.airflow.ui import catalog, pages, runbook
from kvfleet.airflow.ui.catalog import Filters, QueryError
from kvfleet.airflow.ui.svg import LobColours
from kvfleet.airflow.ui.templating import render
from kvfleet.errors import HistoryConfigError, HistoryUnreachable
from kvfleet.history.metrics import ENDPOINT_SERIES_CAP
from kvfleet.settings import ConfigError

if TYPE_CHECKING:
    from kvfleet.history.repos import HistoryRepos

log = logging.getLogger(__name__)
bearer = HTTPBearer(auto_error=False)
DEFAULT_SINCE = {"drift": "30d", "gates": "30d", "runs": "7d", "trends": "30d", "advisor": "7d"}


class NotSignedIn(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


async def airflow_user(request: Request,
                       credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Any:
    """The Airflow user of this request, allowed to read DAG runs; raises NotSignedIn otherwise."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user

    try:
        user = await get_user(request, None, credentials)
    except HTTPException as exc:
        raise NotSignedIn(exc.status_code, str(exc.detail)) from None
    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user):
        raise NotSignedIn(403, f"user {user.get_name()!r} may not read DAG runs, which the kvfleet history records")
    return user


User = Annotated[Any, Depends(airflow_user)]


def _history() -> HistoryRepos:
    """The history as its reader role (``kvfleet.history.db.reader_url``): the page only reads."""
    from kvfleet.history.db import reader_engine
    from kvfleet.history.repos import HistoryRepos

    return HistoryRepos.on(reader_engine())


def _pending() -> list[Any]:
    """The kvfleet gates waiting for a human, from Airflow's metadata database."""
    from kvfleet.airflow import hitl

    return [g for dag_id in pages.GATE_DAGS for g in hitl.pending(dag_id)]


def _with_pending(request: Request, view: str, data: dict[str, Any], history: Any) -> dict[str, Any]:
    """The gates view also shows the pending gates; Airflow's database failing must not hide the history."""
    if view != "gates":
        return data
    try:
        pending = request.app.state.pending_factory()
    except Exception as exc:
        log.exception("kvfleet page: reading the pending gates from Airflow failed")
        return {**data, "pending": [], "pending_error": f"The pending gates could not be read from Airflow "
                                                       f"({type(exc).__name__}); see the API server's log."}
    return {**data, "pending": pages.pending_data(pending, history)}


def _app_history(request: Request) -> HistoryRepos:
    state = request.app.state
    if getattr(state, "history", None) is None:
        state.history = state.history_factory()
    history: HistoryRepos = state.history
    return history


def _filters(request: Request, view: str) -> Filters:
    return Filters.from_query(request.query_params, default_since=DEFAULT_SINCE.get(view, catalog.DEFAULT_SINCE))


async def not_signed_in(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NotSignedIn)
    root = request.scope.get("root_path", "")
    wants_html = not request.url.path.startswith((f"{root}/api", f"{root}/metrics"))
    if exc.status == 401 and wants_html:
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)


async def history_unavailable(request: Request, exc: Exception) -> Response:
    log.exception("kvfleet page: reading the history failed")
    return JSONResponse({"detail": f"the kvfleet history could not be read ({type(exc).__name__}); check "
                                   "KVFLEET_HISTORY_URL or the kvfleet_history connection and the API server's log"},
                        status_code=503)


async def history_refused(request: Request, exc: Exception) -> Response:
    """The history is not configured (kvfleet fails closed) or does not answer: 503 with the cause and the fix
    (the message names the setting or the host, never a password)."""
    log.error("kvfleet page: %s", exc)
    return JSONResponse({"detail": str(exc)}, status_code=503)


async def bad_setting(request: Request, exc: Exception) -> Response:
    """A ``KVFLEET_*`` setting of the API server is bad: the message names it, its value and the fix."""
    log.error("kvfleet page: %s", exc)
    return JSONResponse({"detail": str(exc)}, status_code=503)


async def bad_query(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, QueryError)
    return JSONResponse({"detail": str(exc)}, status_code=exc.status)


def index(request: Request, user: User) -> RedirectResponse:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/fleet", status_code=303)


def list_queries(user: User) -> dict[str, Any]:
    return {"queries": [{"name": n, "parameters": catalog.bind_names(n), "description": catalog.description(n)}
                        for n in catalog.available()]}


def run_query(name: str, request: Request, user: User) -> dict[str, Any]:
    history = _app_history(request)
    binds = _filters(request, "query").binds(name, engine=history.engine)
    return {"query": name, "parameters": catalog.jsonable(binds),
            "rows": catalog.jsonable(history.queries.rows(name, **binds))}


def api_view(view: str) -> Callable[..., dict[str, Any]]:
    def handler(request: Request, user: User) -> dict[str, Any]:
        history = _app_history(request)
        data = _with_pending(request, view, pages.build(view, history, _filters(request, view)), history)
        return dict(catalog.jsonable({"view": view, **data}))

    handler.__name__ = f"api_{view}"
    return handler


def html_view(view: str) -> Callable[..., HTMLResponse]:
    def handler(request: Request, user: User) -> HTMLResponse:
        history = _app_history(request)
        base = str(request.scope.get("root_path", ""))
        f = _filters(request, view)
        known_lobs = pages.lobs(history)
        colours = LobColours(known_lobs)
        ctx = {"clusters": [r["cluster"] for r in history.queries.rows("ui_clusters")], "lobs": known_lobs}
        data = _with_pending(request, view, pages.build(view, history, f), history)
        body = pages.RENDERERS[view](data, f, colours, base, ctx)
        return HTMLResponse(pages.page(view, body, base=base, user=user.get_name(), colours=colours))

    handler.__name__ = f"html_{view}"
    return handler


def openapi_schema(request: Request, user: User) -> dict[str, Any]:
    """The app's OpenAPI schema: for a signed-in user who may read DAG runs only, as every view (FastAPI's own
    route, and its /docs and /redoc pages, are off)."""
    return dict(request.app.openapi())


def runbook_page(request: Request, user: User) -> Response:
    base = str(request.scope.get("root_path", ""))
    if runbook.external_url():
        return RedirectResponse(runbook.external_url(), status_code=307)
    source = runbook.source()
    if source is None:
        return HTMLResponse(str(render("runbook_missing.html")), status_code=404)
    body = render("runbook.html", html=runbook.render(source.read_text()))
    return HTMLResponse(pages.page("runbook", body, base=base, user=user.get_name(), colours=LobColours([])))


def metrics_page(request: Request, user: User) -> Response:
    """The Prometheus text exposition of the history; without the pending gates (``kvfleet_gates_readable`` 0)
    when Airflow's HITL records cannot be read, so the history's metrics still arrive."""
    from prometheus_client import CONTENT_TYPE_LATEST  # only this route writes the exposition

    from kvfleet.airflow.ui import metrics

    reading = _app_history(request).metrics.read(request.app.state.metrics_endpoint_cap)
    try:
        gates = request.app.state.pending_factory()
    except Exception:
        log.exception("kvfleet metrics: reading the pending gates from Airflow failed")
        gates = None
    body = metrics.exposition(reading, metrics.pending_by_dag(gates), pages.GATE_DAGS)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def create_app(history_factory: Callable[[], Any] = _history,
               pending_factory: Callable[[], list[Any]] = _pending,
               metrics_endpoint_cap: int = ENDPOINT_SERIES_CAP) -> FastAPI:
    """The app; ``history_factory`` builds the HistoryRepos repository (once, on the first request that reads);
    ``pending_factory`` lists the gates waiting for a human (Airflow's HITL records); ``metrics_endpoint_cap``: at
    most this many endpoints get per-endpoint series on ``/metrics``."""
    app = FastAPI(title="kvfleet", description="kvfleet fleet, verification, drift, Curvine, gate and run history",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.history_factory = history_factory
    app.state.pending_factory = pending_factory
    app.state.history = None
    app.state.metrics_endpoint_cap = metrics_endpoint_cap
    app.add_exception_handler(NotSignedIn, not_signed_in)
    app.add_exception_handler(QueryError, bad_query)
    app.add_exception_handler(ConfigError, bad_setting)
    app.add_exception_handler(SQLAlchemyError, history_unavailable)
    app.add_exception_handler(AlembicError, history_unavailable)
    # The history not configured (it fails closed) or not answering: the same 503 naming the cause.
    app.add_exception_handler(HistoryConfigError, history_refused)
    app.add_exception_handler(HistoryUnreachable, history_refused)
    app.get("/", include_in_schema=False)(index)
    app.get("/metrics", include_in_schema=False)(metrics_page)
    app.get("/runbook", response_class=HTMLResponse, include_in_schema=False)(runbook_page)
    app.get("/api/openapi.json", include_in_schema=False)(openapi_schema)
    app.get("/api/queries")(list_queries)
    app.get("/api/queries/{name}")(run_query)
    for view in pages.VIEWS:
        app.get(f"/api/{view}")(api_view(view))
        app.get(f"/{view}", response_class=HTMLResponse, include_in_schema=False)(html_view(view))
    return app
