"""The dashboard's routes: the public, read-only page at `/` and `/dashboard`, its script
and style, and the JSON it polls (`/v1/dashboard`).

Every asset ships in the package (`orchestrator/static/`): no CDN, nothing fetched at run
time, so the page works on a pool nobody outside can reach. What workers wrote (URLs,
verdict reasons that quote their files) reaches the page only as JSON, and the script
puts it into the page as text, never as markup; the Content-Security-Policy below
refuses inline and foreign script as a second wall.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from swarmrl.orchestrator.board import Dashboard
from swarmrl.orchestrator.pool import Pool

ASSETS = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def asset(name: str) -> bytes:
    return resources.files("swarmrl.orchestrator").joinpath("static", name).read_bytes()


def add_dashboard(app: FastAPI, pool: Pool) -> None:
    """Add the dashboard's routes to the orchestrator's app."""
    files = {name: asset(name) for name in ASSETS}  # read once: a missing file fails at start

    def served(name: str):
        def serve() -> Response:
            return Response(files[name], media_type=ASSETS[name], headers=HEADERS)

        return serve

    page = served("dashboard.html")
    app.add_api_route("/", page, methods=["GET"], include_in_schema=False)
    app.add_api_route(
        "/dashboard",
        page,
        methods=["GET"],
        response_class=HTMLResponse,  # documented as text/html, which it is
        tags=["public"],
        summary="The live dashboard (HTML): run, learning curves, members, trust, broadcast",
    )
    for name in ("dashboard.js", "dashboard.css"):
        app.add_api_route(
            f"/dashboard/{name}", served(name), methods=["GET"], include_in_schema=False
        )

    @app.get("/v1/dashboard", response_model=Dashboard, tags=["public"])
    async def dashboard() -> Dashboard:
        """What the dashboard page polls: the pool status, the run's pace, the trainer's
        learning curves, each member's files and held checkpoint, verdicts by check and
        each checkpoint's spread."""
        return await run_in_threadpool(pool.dashboard)
