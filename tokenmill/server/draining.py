"""uvicorn's server with a drain on SIGTERM."""

from __future__ import annotations

import logging
import time

import uvicorn

logger = logging.getLogger("tokenmill.server")


class DrainingServer(uvicorn.Server):
    """SIGTERM drains before uvicorn stops listening: /health answers 503 and new generation
    requests 503 (server_shutting_down) while in-flight requests finish, up to the drain
    timeout; then uvicorn shuts down. A second signal stops at once."""

    def __init__(self, config, holder: dict, drain_timeout: float) -> None:
        super().__init__(config)
        self.holder = holder
        self.drain_timeout = drain_timeout
        self.drain_started: float | None = None

    def handle_exit(self, sig, frame) -> None:
        app = self.holder.get("app")
        if self.drain_started is not None or app is None:
            return super().handle_exit(sig, frame)
        self.drain_started = time.monotonic()
        app.state.tm.draining = True
        logger.warning("draining: %d sequences in flight", app.state.tm.engine.num_in_flight)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            engine = self.holder["app"].state.tm.engine
            waited = time.monotonic() - self.drain_started
            if engine.num_in_flight == 0 or waited >= self.drain_timeout:
                self.should_exit = True
        return await super().on_tick(counter)
