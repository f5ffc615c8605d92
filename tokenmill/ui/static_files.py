"""Serves the UI's files at /ui in front of the API key or gateway check: the pages hold no
data (every data call sends the key), and the page must load to ask for it. Only the files
packaged under static/ are served, read once at start; anything else passes through. Also
/ui/auth: whether a key is needed at all (so the page asks before its first call, instead of
failing one).

Every page works behind a reverse proxy at a sub-path: the pages use relative URLs only, and
/ui answers with a relative redirect to ui/."""

from __future__ import annotations

import json
from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
PAGES = {"/ui/": "playground.html", "/ui/dashboard": "dashboard.html"}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".mjs": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".png": b"image/png",
}
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
)


def load_files(root: Path = STATIC_DIR) -> dict[str, tuple[bytes, bytes]]:
    """URL path -> (content type, body) of every servable file under `root`."""
    files: dict[str, tuple[bytes, bytes]] = {}
    for path in sorted(root.rglob("*")):
        kind = _TYPES.get(path.suffix)
        if path.is_file() and kind is not None:
            files["/ui/static/" + path.relative_to(root).as_posix()] = (kind, path.read_bytes())
    for url, name in PAGES.items():
        files[url] = files.pop("/ui/static/" + name)
    return files


class StaticUI:
    """Pure ASGI: GET/HEAD of a UI file is answered here, everything else goes on."""

    def __init__(self, app, key_required: bool, root: Path = STATIC_DIR) -> None:
        self.app = app
        self.files = load_files(root)
        auth = json.dumps({"key_required": key_required}).encode()
        self.files["/ui/auth"] = (b"application/json", auth)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path == "/ui":
            return await _reply(send, 307, [(b"location", b"ui/")], b"", scope)
        found = self.files.get(path)
        if found is None:
            return await self.app(scope, receive, send)
        kind, body = found
        await _reply(send, 200, [(b"content-type", kind)], body, scope)


async def _reply(send, status: int, headers: list, body: bytes, scope) -> None:
    length = (b"content-length", str(len(body)).encode())
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, length, *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
