"""While `skippy serve` loads its model, its port is already bound and every route answers 503
(`/health`: {"status": "loading"}), with Retry-After. A router's health check, or an orchestrator's
readiness probe, then tells a replica that is loading from one that is gone (a refused
connection) and keeps it out of rotation until it is ready; sglang-router takes any non-2xx
/health as not ready (sgl-model-gateway/src/core/steps/worker/local/detect_connection.rs).
"""

from __future__ import annotations

import types
from typing import Any

from starlette.responses import JSONResponse

from .api_errors import error_body

RETRY_AFTER_S = 1


class LoadingGate:
    """An ASGI app that answers 503 until `open(app)`, then hands every request to `app`. The server's
    lifespan events are answered here (the app has no startup work of its own)."""

    def __init__(self) -> None:
        self.app: Any = None

    @property
    def state(self) -> Any:
        """The opened app's state (serve_app drains its `server`); while loading, none to drain."""
        return self.app.state if self.app is not None else types.SimpleNamespace(server=None)

    def open(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if self.app is not None:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket while loading: refused
            await send({"type": "websocket.close", "code": 1013})
            return
        if scope["path"] == "/health":
            body: dict[str, Any] = {"status": "loading"}
        else:
            body = error_body("the model is still loading", "server_error", code="loading")
        response = JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        await response(scope, receive, send)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
