"""The served OpenAPI document with the real request bodies: the endpoints read their
bodies by hand (server/body.py), so FastAPI cannot see them; this adds each body's JSON
schema from its pydantic model (schemathesis and client generators rely on it)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_REF = "#/components/schemas/{model}"


def add_request_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        refs, defs = models_json_schema(
            [(model, "validation") for model in bodies.values()], ref_template=_REF
        )
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.get("$defs", {}))
        for path, model in bodies.items():
            operation = doc["paths"][path]["post"]
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(model, "validation")]}},
            }
            operation.setdefault("responses", {})["400"] = {"description": "invalid request"}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
