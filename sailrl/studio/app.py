"""The studio's ASGI application: the page, its static files and the API, behind :class:`Guard`.

Starlette (a small, well-kept ASGI toolkit: routing, static files, a test client) served by uvicorn; the page is
plain JavaScript modules and CSS in ``static/``, shipped in the package (no CDN, no build step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.responses import FileResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sailrl.studio.api import ROUTES
from sailrl.studio.security import Guard, allowed_hosts, cookie_name
from sailrl.studio.session import Studio

STATIC = Path(__file__).resolve().parent / "static"


async def _index(request: Any) -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


def build_app(studio: Studio, *, token: str, host: str, port: int) -> Guard:
    """The guarded application for ``studio``, answering only to ``host:port`` with session ``token``."""
    app = Starlette(routes=[Route("/", _index, methods=["GET"]), *ROUTES,
                            Mount("/static", StaticFiles(directory=STATIC), name="static")])
    app.state.studio = studio
    return Guard(app, token=token, hosts=allowed_hosts(host, port), cookie=cookie_name(port))
