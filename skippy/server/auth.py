"""`--api-key`: Bearer authentication as OpenAI clients send it, in front of the whole app.

Every route needs `Authorization: Bearer <key>` except the ones an orchestrator or a scraper
polls without credentials (`/health`, `/metrics`), as vLLM leaves them open. A missing or
wrong key is a 401 with OpenAI's error body. Keys are compared in constant time.
"""

from __future__ import annotations

from ..errors import InvalidInputError

import hmac
from typing import Any, Sequence

from starlette.responses import JSONResponse

from .api_errors import unauthorized

OPEN_PATHS = frozenset({"/health", "/metrics"})


class BearerAuth:
    """ASGI middleware: HTTP requests outside OPEN_PATHS need one of `keys` as a Bearer token."""

    def __init__(self, app: Any, keys: Sequence[str]) -> None:
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise InvalidInputError("BearerAuth needs at least one non-empty key")
        self.app = app
        self.keys = tuple(k.encode() for k in keys)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self.authorized(scope):
            err = unauthorized()
            await JSONResponse(err.body(), status_code=err.status, headers=err.headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def authorized(self, scope: Any) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, token = header.strip().partition(b" ")
        token = token.strip()
        # compare against every key (no early exit): the time does not say which one nearly matched
        hits = [hmac.compare_digest(token, k) for k in self.keys]
        return scheme.lower() == b"bearer" and any(hits)
