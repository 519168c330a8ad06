"""OpenAI-compatible HTTP server over one engine: protocol (pure), app (Starlette on trio),
metrics (Prometheus, one registry per app), serve (hypercorn's trio worker, graceful shutdown),
limits (request body, header and connection bounds)."""

from .app import ServerState, create_app, default_model_names
from .limits import HttpLimits, RequestLimits
from .loading import LoadingGate
from .serve import drain, serve_app, wait_for_signal

__all__ = ["HttpLimits", "LoadingGate", "RequestLimits", "ServerState", "create_app", "default_model_names", "drain",
           "serve_app", "wait_for_signal"]
