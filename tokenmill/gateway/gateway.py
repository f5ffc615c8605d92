"""The gateway's running state: config (reloaded when its file changes), the database, the
ledger, the key ring, the limiter, the metrics, and the model-based judge."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

from tokenmill.gateway.config import GatewayConfig, load_gateway_config
from tokenmill.gateway.endpoints.common import ExchangeContext
from tokenmill.gateway.keys import KeyRing
from tokenmill.gateway.limits import Limiter
from tokenmill.gateway.metrics import GatewayMetrics
from tokenmill.gateway.store import queries
from tokenmill.gateway.store.database import open_database
from tokenmill.gateway.store.ledger import Ledger
from tokenmill.gateway.store.migrations import migrate

logger = logging.getLogger("tokenmill.gateway")

CONFIG_POLL_S = 1.0


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        config_path: str | Path | None = None,
        registry=None,
        max_body_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.config = config
        self.config_path = Path(config_path) if config_path is not None else None
        self._config_stamp = self._stamp()
        self.max_body_bytes = max_body_bytes
        self.db = open_database(config.database)
        migrate(self.db)
        self.ledger = Ledger.open(config.database, config.journal)
        self.keys = KeyRing(self.db)
        self.keys.reload()
        self.limiter = Limiter(self._spend_since)
        self.metrics = GatewayMetrics(registry, self.ledger.pending)
        self.app = None  # the inner ASGI app (set by the middleware)
        # the server's or router's app: its routes read it from the scope (request.app), which
        # requests the gateway makes itself (the judge, batch lines) must carry
        self.root_app = None
        self._tasks: list[asyncio.Task] = []
        self._derive()

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> Gateway:
        return cls(load_gateway_config(path), config_path=path, **kwargs)

    def _derive(self) -> None:
        rules = self.config.guardrails.rules
        self.has_input_rules = any("input" in r.stages for r in rules)
        self.has_output_rules = any("output" in r.stages for r in rules)
        self.output_rules_modify = any("output" in r.stages and r.action != "audit" for r in rules)
        self.has_classifier = any(r.kind == "classifier" for r in rules)

    def context(
        self, config: GatewayConfig, key, endpoint: str, model: str, *,
        stream: bool, tools: dict[str, Any], request_id: str = "",
    ) -> ExchangeContext:  # fmt: skip
        """One request's view of the config: its rules, the key's tool policy, the judge."""
        return ExchangeContext(
            request_id=request_id,
            endpoint=endpoint,
            model=model,
            stream=stream,
            guardrails=config.guardrails,
            output_rules=self.has_output_rules,
            output_modify=self.output_rules_modify,
            policy=config.tool_policy(key.tool_policy),
            tools=tools,
            judge=self.judge_for(model),
        )

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.keys.refresh_forever(self.config.key_refresh_s)),
            loop.create_task(self._watch_config()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.to_thread(self.ledger.close)

    # ------------------------------------------------------------ config reload

    def _stamp(self) -> tuple[float, int] | None:
        if self.config_path is None:
            return None
        try:
            st = os.stat(self.config_path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    async def _watch_config(self) -> None:
        while self.config_path is not None:
            await asyncio.sleep(CONFIG_POLL_S)
            stamp = self._stamp()
            if stamp is None or stamp == self._config_stamp:
                continue
            self._config_stamp = stamp
            self.reload_config()

    def reload_config(self) -> bool:
        """Swaps in the file's config; a bad file keeps the running one. Requests in flight
        keep the config they started with; database and journal stay as started."""
        try:
            config = load_gateway_config(self.config_path)
        except Exception as e:
            logger.error("gateway: config %s not reloaded: %s", self.config_path, e)
            self.metrics.config_reloads.labels("error").inc()
            return False
        if config.database != self.config.database:
            logger.warning("gateway: a new database takes a restart; keeping %s", "the current one")
        self.config = GatewayConfig(
            **{**config.__dict__, "database": self.config.database, "journal": self.config.journal}
        )
        self._derive()
        self.metrics.config_reloads.labels("ok").inc()
        logger.info("gateway: config reloaded from %s", self.config_path)
        return True

    # ------------------------------------------------------------ ledger

    def record(self, item) -> None:
        self.ledger.record(item)

    async def _spend_since(self, key_id: str, since: float) -> float:
        def spend() -> float:
            self.ledger.flush(timeout=5.0)
            return queries.spend(self.db, key_id, since)

        return await asyncio.to_thread(spend)

    async def call_inner(self, scope, receive, send) -> None:
        """A request of the gateway's own to the inner app, with what the outer layers give
        every request filled in (the scope's app, a request id)."""
        state = scope.get("state") or {}
        scope = {
            **scope,
            "app": scope.get("app", self.root_app),
            "state": {"request_id": self.new_request_id(), **state},
        }
        await self.app(scope, receive, send)

    # ------------------------------------------------------------ the judge

    def judge_for(self, model: str):
        """The served model as a classifier: the probabilities of its next token after the
        judging prompt (top 20 logprobs, greedy), asked in-process of the inner app."""
        if not self.has_classifier:
            return None
        timeout = self.config.classifier_timeout_s

        async def judge(prompt: str) -> dict[str, float]:
            import httpx

            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 20,
            }
            transport = httpx.ASGITransport(app=self.call_inner)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                reply = await client.post("/v1/chat/completions", json=body, timeout=timeout)
            reply.raise_for_status()
            content = reply.json()["choices"][0]["logprobs"]["content"]
            probs: dict[str, float] = {}
            for entry in content[0]["top_logprobs"] if content else []:
                token = entry["token"].strip().lower()
                probs[token] = probs.get(token, 0.0) + math.exp(entry["logprob"])
            return probs

        return judge
