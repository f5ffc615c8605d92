"""A gateway in front of the fake upstream, in-process (httpx's ASGI transport), with an admin
key in its environment and helpers to make keys and read the ledger."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.gateway.fake_upstream import Seen, build_fake_upstream
from tokenmill.gateway.config import parse_gateway_config
from tokenmill.gateway.gateway import Gateway
from tokenmill.gateway.middleware import GatewayMiddleware

ADMIN_KEY = "admin-" + "x" * 40


def write_config(tmp_path: Path, extra: dict[str, Any] | None = None) -> Path:
    config = {
        "database": str(tmp_path / "gateway.sqlite3"),
        "journal": str(tmp_path / "journal"),
        "admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest(),
        "prices": {"default": {"input": 1.0, "cached_input": 0.5, "output": 2.0}},
        **(extra or {}),
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Harness:
    gateway: Gateway
    app: Any
    seen: Seen

    def client(self, key: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers=headers, timeout=30
        )

    async def new_key(self, **fields: Any) -> tuple[str, str]:
        async with self.client(ADMIN_KEY) as admin:
            reply = await admin.post("/admin/keys", json=fields)
        assert reply.status_code == 201, reply.text
        data = reply.json()
        return data["key"], data["id"]

    def ledger_rows(self) -> list[tuple]:
        assert self.gateway.ledger.flush(10)
        return self.gateway.db.fetchall(
            "SELECT request_id, key_id, prompt_tokens, cached_tokens, completion_tokens, cost_usd,"
            " status, finish_reason FROM usage ORDER BY created"
        )

    def close(self) -> None:
        self.gateway.ledger.close()


def make_harness(tmp_path: Path, extra: dict[str, Any] | None = None) -> Harness:
    path = write_config(tmp_path, extra)
    config = parse_gateway_config(yaml.safe_load(path.read_text()), tmp_path)
    gateway = Gateway(config, config_path=path)
    seen = Seen()
    app = GatewayMiddleware(build_fake_upstream(seen), gateway)
    return Harness(gateway, app, seen)
