"""The admin API's app: `/admin/...` takes the admin key only (checked here, before any
route), `/v1/usage` any key (the gateway's middleware has checked it)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from tokenmill.gateway.admin import keys, usage
from tokenmill.gateway.admin.common import admin_error, is_admin


def build_admin_app(gateway) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    app.middleware("http")(admin_only)
    app.add_exception_handler(RequestValidationError, invalid)
    app.include_router(keys.router)
    app.include_router(usage.router)
    return app


async def admin_only(request: Request, call_next):
    if request.url.path.startswith("/admin") and not is_admin(
        request.app.state.gateway, request.headers.get("authorization", "").encode("latin-1")
    ):
        return admin_error(401, "the admin API needs the admin key", "invalid_api_key")
    return await call_next(request)


async def invalid(_request: Request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    return admin_error(400, f"{where}: {first.get('msg', 'invalid')}", "invalid_value")
