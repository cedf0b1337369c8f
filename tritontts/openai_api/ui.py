"""The page for trying voices (`/ui/`, `/` redirects to it): static files of this package, no build step, nothing
fetched from elsewhere. The page calls the API it is served by; its files hold no key (the user types it)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from tritontts.openai_api.errors import ApiError

UI_PATH = "/ui/"
FILES = {
    "": ("index.html", "text/html; charset=utf-8"),
    "index.html": ("index.html", "text/html; charset=utf-8"),
    "app.js": ("app.js", "text/javascript; charset=utf-8"),
    "live-text.js": ("live-text.js", "text/javascript; charset=utf-8"),
    "style.css": ("style.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; media-src 'self' blob:; connect-src 'self'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files("tritontts.openai_api").joinpath("static", name).read_bytes()


def ui_router() -> APIRouter:
    """`GET /` and `/ui` redirect (relative, so a path prefix of a proxy is kept) to `/ui/`, which serves the page."""
    router = APIRouter(include_in_schema=False)
    cache = {name: _read(file) for name, (file, _) in FILES.items()}

    @router.get("/")
    async def root() -> RedirectResponse:
        return RedirectResponse("ui/", status_code=307)

    @router.get("/ui")
    async def ui_without_slash() -> RedirectResponse:
        return RedirectResponse("ui/", status_code=307)

    @router.get(UI_PATH + "{name:path}")
    async def ui_file(name: str) -> Response:
        if name not in FILES:
            raise ApiError(404, f"no such file of the page: '{name}'", code="not_found")
        return Response(cache[name], media_type=FILES[name][1], headers=HEADERS)

    return router
