"""What a router asks of its workers, beside the OpenAI API: SGLang's worker endpoints, in the shapes
sglang-router reads them (the router `skippy cluster` starts), and vLLM's `/load`.

The contract, from sglang-router's source (sgl-project/sglang, sgl-model-gateway/src/, the release
0.3.2 this extra pins; the calls confirmed against that binary):

- `GET /health` (core/steps/worker/local/detect_connection.rs, and the periodic check of
  core/worker.rs): any 2xx is healthy, anything else or no answer is not. Served by `app.health`:
  503 while draining (and, under `skippy serve`, 503 while the model loads: server.loading).
- `GET /server_info` at registration (steps/worker/local/discover_metadata.rs, `ServerInfo`): it
  parses model_id (alias "model"), model_path, served_model_name, dp_size, version, max_batch_size,
  max_total_tokens, max_prefill_tokens, max_running_requests, max_num_reqs; it keeps
  served_model_name and model_path as labels, and create_worker.rs makes the worker's model id of
  served_model_name, else model_path, else "unknown". The router answers `/v1/models` from those ids,
  which is why it said `unknown` before this endpoint existed. discover_dp.rs reads dp_size (with
  --dp-aware). SGLang also serves it as `/get_server_info`; so do we (vllm-router proxies that one).
- `GET /model_info` (same file, `ModelInfo`): model_path, tokenizer_path, is_generation, model_type,
  architectures; model_type and architectures become labels. `/get_model_info` is what the router's
  own `/get_model_info` proxies to the first worker. register_tokenizer.rs then tries to load a
  tokenizer from tokenizer_path (or model_path): a GGUF is not one, so it logs a warning; HTTP
  routing does not need it.
- `GET /get_load` (core/worker_manager.rs, `get_worker_load`, polled by the LoadMonitor only while a
  power_of_two policy exists): a JSON array, one object per DP rank, of which it sums `num_tokens`.
  SGLang's GetLoadReqOutput is {dp_rank, num_reqs (running + waiting), num_waiting_reqs, num_tokens}.
- `POST /flush_cache` (worker_manager.rs, `flush_cache_all`, for the router's own /flush_cache): any
  2xx counts as flushed. SGLang (http_server.py) answers 200, or 400 when requests run or wait (its
  scheduler will not flush then); so do we, with a JSON error body.

vllm-router (vllm-project/router, forked from sgl-router) proxies `/v1/models` and `/get_server_info`
to its first worker, flushes with POST /flush_cache, and its power_of_two reads `{"load": N}` from
`/get_load` (src/routers/http/router.rs, `get_worker_load_static`): an object where SGLang now sends an
array, so one body cannot serve both; we answer SGLang's. vLLM's own `/load` ({"server_load": N},
requests in flight) is here too.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import EngineBusyError
from .api_errors import ApiError


def _version() -> str:
    try:
        return importlib.metadata.version("skippy")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _model_path(engine: Any) -> str:
    model = getattr(engine.runtime, "model", None)
    return str(model.path) if model is not None else engine.model_name


def server_info(engine: Any, names: list[str]) -> dict[str, Any]:
    """/server_info: the fields sglang-router's `ServerInfo` parses (model_id, model_path,
    served_model_name, dp_size, version, max_batch_size, max_total_tokens, max_prefill_tokens,
    max_running_requests, max_num_reqs), SGLang's own `max_total_num_tokens`, and skippy's limits by
    their own names (n_ctx, n_batch, n_seq_max, ceiling)."""
    lanes = engine.lanes
    runtime = engine.runtime
    ceiling = lanes.ceiling
    model = getattr(runtime, "model", None)
    return {
        "model_id": names[0],
        "served_model_name": names[0],
        "model_path": _model_path(engine),
        "tokenizer_path": _model_path(engine),  # the GGUF carries its tokenizer
        "dp_size": 1,
        "version": _version(),
        # SGLang's names for the same limits: the cell pool (max_total_num_tokens is its KV pool size),
        # the tokens one step takes, and the running sequences
        "max_total_tokens": engine.n_ctx,
        "max_total_num_tokens": engine.n_ctx,
        "max_prefill_tokens": runtime.n_batch,
        "max_running_requests": ceiling,
        "max_batch_size": ceiling,
        "max_num_reqs": ceiling,
        # skippy's own
        "n_ctx": engine.n_ctx,
        "n_batch": runtime.n_batch,
        "n_seq_max": lanes.n_seq_max,  # the context's sequence ids: the ceiling plus the prefix cache's
        "ceiling": ceiling,
        "ceiling_reason": lanes.reason,
        "prefix_slots": lanes.reserved,
        "max_waiting": engine.config.max_waiting,
        "n_vocab": runtime.n_vocab,
        "arch": runtime.arch,
        "n_ctx_train": model.n_ctx_train if model is not None else None,
        "aliases": names,
    }


def model_info(engine: Any) -> dict[str, Any]:
    """/model_info: sglang-router's `ModelInfo` fields we can answer (architectures, HF class names,
    are not in a GGUF: left out, as the router allows). model_type is the GGUF architecture, which for
    most families is the HF model_type too (llama, qwen2, gemma2, ...)."""
    return {"model_path": _model_path(engine), "tokenizer_path": _model_path(engine), "is_generation": True,
            "model_type": engine.runtime.arch}


def load(stats: Any) -> list[dict[str, Any]]:
    """/get_load: SGLang's GetLoadReqOutput per DP rank (one here), the array sglang-router sums
    `num_tokens` of. num_tokens are the tokens running sequences hold (SGLang leaves the evictable
    prefix cache out too); `kv` adds each memory component's cells (attention, recurrent state)."""
    kv = {}
    for kind, used in stats.kv_used.items():
        free = stats.kv_free.get(kind, 0)
        kv[getattr(kind, "name", str(kind)).lower()] = {"used": used, "free": free,
                                                          "usage": used / (used + free) if used + free else 0.0}
    return [{"dp_rank": 0, "num_reqs": stats.running + stats.waiting, "num_waiting_reqs": stats.waiting,
             "num_tokens": stats.running_tokens, "num_running_reqs": stats.running,
             "prefix_cache_tokens": stats.prefix_resident_tokens, "kv": kv}]


# -- routes ---------------------------------------------------------------------------------


async def server_info_route(request: HttpRequest) -> Response:
    state = request.app.state.server
    return JSONResponse(server_info(state.engine, state.model_names))


async def model_info_route(request: HttpRequest) -> Response:
    return JSONResponse(model_info(request.app.state.server.engine))


async def get_load_route(request: HttpRequest) -> Response:
    return JSONResponse(load(request.app.state.server.engine.stats()))


async def vllm_load_route(request: HttpRequest) -> Response:
    """vLLM's /load (--enable-server-load-tracking): requests queued or running."""
    return JSONResponse({"server_load": request.app.state.server.engine.live})


def requests_running(n: int | None = None) -> ApiError:
    """SGLang refuses a flush while requests run or wait (400); so do we, saying why."""
    count = f"{n} request(s)" if n is not None else "requests"
    return ApiError(400, f"the prefix cache is not flushed while requests run or wait ({count} now): "
                    "retry when the server is idle", code="requests_running")


async def flush_cache_route(request: HttpRequest) -> Response:
    """Drop every resident prefix (Engine.flush_prefix_cache); 400 while requests run or wait."""
    state = request.app.state.server
    if state.in_flight or state.engine.live:
        raise requests_running(state.engine.live or len(state.in_flight))
    try:
        dropped = await state.engine.flush_prefix_cache()
    except EngineBusyError:
        raise requests_running() from None
    return JSONResponse({"status": "ok", "message": "Cache flushed.", "entries_dropped": dropped})


def routes() -> list[Any]:
    """The routes create_app registers."""
    return [
        Route("/server_info", server_info_route, methods=["GET"]),
        Route("/get_server_info", server_info_route, methods=["GET"]),
        Route("/model_info", model_info_route, methods=["GET"]),
        Route("/get_model_info", model_info_route, methods=["GET"]),
        Route("/get_load", get_load_route, methods=["GET"]),
        Route("/load", vllm_load_route, methods=["GET"]),
        Route("/flush_cache", flush_cache_route, methods=["GET", "POST"]),
    ]
