"""The portal's routes: the single-page app's shell and its static assets.

The portal is plain ES modules + CSS shipped in `corral/web/static/` (no build step, no CDN: the
platform often runs air-gapped). Every client route (`/jobs/42`, `/nodes` ...) returns the same
shell; the JavaScript then talks only to the public REST API under `/api/v1`, like the CLI.

Client routes are listed explicitly (answered 200). Any other GET path gets the shell with status
404, so the app draws its 404 page instead of a bare JSON error; paths of the API and the server's
own documents (`/api`, `/docs`, `/redoc`, `/openapi.json`, `/metrics`) keep a JSON 404 even if this
router were included before theirs. The app factory includes this router last.
"""

from __future__ import annotations

import mimetypes
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

router = APIRouter(include_in_schema=False)

STATIC_DIR = Path(str(resources.files("corral.web") / "static"))
ASSET_PREFIX = "/portal-assets"
# Top-level client routes of the single-page app; `/{section}/{rest}` covers `/jobs/42` etc.
CLIENT_SECTIONS = (
    "login",
    "jobs",
    "submit",
    "nodes",
    "groups",
    "data",
    "environments",
    "templates",
    "models",
    "alerts",
    "usage",
    "profile",
    "not-found",
)
AUDIT_SECTION = "audit"  # the admin audit log (apart from the tuple: several areas add sections)
ONCALL_SECTION = "oncall"  # on-call, pages (docs/operations.md)
WORKSPACES_SECTION = "workspaces"  # interactive workspaces (corral.services.workspaces)
INCIDENTS_SECTION = "incidents"  # incidents (admins)
USERS_SECTION = "users"  # user management (admins)

# Assets are small and change only with a release; "no-cache" makes browsers revalidate (cheap
# 304s) so an upgraded server never serves a stale mix of old and new modules.
_ASSET_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
_SHELL_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    # Everything is same-origin; inline scripts are not needed, inline styles are (SVG charts).
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'"
    ),
}

mimetypes.add_type("text/javascript", ".js")
mimetypes.add_type("text/css", ".css")
mimetypes.add_type("image/svg+xml", ".svg")


NOT_PORTAL_PREFIXES = ("/api/", "/api", "/docs", "/redoc", "/openapi.json", "/metrics", ASSET_PREFIX)


def _shell(status_code: int = 200) -> HTMLResponse:
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    return HTMLResponse(html, status_code=status_code, headers=_SHELL_HEADERS)


@router.get("/", response_class=HTMLResponse)
def portal_home() -> HTMLResponse:
    return _shell()


@router.get("/favicon.ico")
def favicon() -> Response:
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml", headers=_ASSET_HEADERS)


@router.get(ASSET_PREFIX + "/{asset_path:path}")
def portal_asset(asset_path: str) -> Response:
    root = STATIC_DIR.resolve()
    try:
        target = (root / asset_path).resolve()
        # Refuse anything that escapes the static folder (`..`, absolute paths, symlinks out).
        found = target.is_relative_to(root) and target.is_file()
    except (ValueError, OSError):  # a NUL in the path, a name too long for the file system
        found = False
    if not found:
        raise HTTPException(status_code=404, detail=f"no portal asset {asset_path[:200]!r}")
    media_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return FileResponse(target, media_type=media_type, headers=_ASSET_HEADERS)


def _client_route(section: str) -> None:
    def page() -> HTMLResponse:
        return _shell()

    def subpage(rest: str) -> HTMLResponse:
        return _shell()

    router.add_api_route(f"/{section}", page, methods=["GET"], response_class=HTMLResponse)
    router.add_api_route(f"/{section}/{{rest:path}}", subpage, methods=["GET"], response_class=HTMLResponse)


for _section in (
    *CLIENT_SECTIONS,
    AUDIT_SECTION,
    ONCALL_SECTION,
    WORKSPACES_SECTION,
    INCIDENTS_SECTION,
    USERS_SECTION,
):
    _client_route(_section)


# Registered last: only paths no other route of this router matched reach it.
@router.get("/{unknown_path:path}", response_model=None)
def portal_not_found(unknown_path: str) -> Response:
    path = "/" + unknown_path
    if any(path == p or path.startswith(p.rstrip("/") + "/") for p in NOT_PORTAL_PREFIXES):
        # Raised, not returned: the app's handler answers 405 + Allow where another method fits.
        raise HTTPException(status_code=404, detail="Not Found")
    return _shell(status_code=404)
