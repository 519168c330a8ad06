"""`skippy` command line: build the native layer, make or fetch models, generate text."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loguru import logger

from .errors import SkippyError


def _resolve_checked(args: argparse.Namespace):
    """The model file for a command; a file the user names is first loaded in a probe process,
    since a malformed GGUF can abort llama.cpp (our pinned models are checked by sha256)."""
    from .models import REAL_MODELS, resolve_model
    from .native import ensure_built, probe_model

    path = resolve_model(args.model, args.family)
    if args.model is not None and args.model not in REAL_MODELS:
        ensure_built()
        probe_model(path)
    return path


def _build(args: argparse.Namespace) -> int:
    from .native import BuildFlags, ensure_built

    started = time.monotonic()
    flags = BuildFlags(native=not args.portable, cuda=args.cuda)
    build = ensure_built(flags, tools=args.tools, progress=not args.quiet)
    print(f"native build ready: {build.root} ({time.monotonic() - started:.1f}s)")
    if args.tools:
        for name in ("llama-server", "llama-batched-bench"):
            print(f"  {build.tool(name)}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from .models import synth, synthetic_model

    if args.out:
        path = synth.write_synthetic(args.family, args.out, seed=args.seed, size=args.size)
    else:
        path = synthetic_model(args.family, seed=args.seed, size=args.size)
    print(path)
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from .models import real_model

    print(real_model(args.name))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from ._generate import generate_tokens
    from .families import derive_class
    from .native import Context, ContextOptions, Model, ensure_built
    from .sampling import Sampler, SamplingParams
    from .scheduling.text import TextAssembler

    ensure_built()
    path = _resolve_checked(args)
    sampler = Sampler(SamplingParams(temperature=args.temperature, seed=args.seed))
    with Model(path, n_gpu_layers=args.n_gpu_layers) as model:
        prompt = model.tokenizer.tokenize(args.prompt)
        n_ctx = min(max(model.n_ctx_train, 256), max(512, len(prompt) + args.max_tokens))
        opts = ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_seq_max=1, threads=args.threads)
        with Context(model, opts) as ctx:
            derive_class(ctx.ledger(), arch=model.arch, memory_type=ctx.memory_type())  # a memory it can decode with
            text = TextAssembler(())
            sys.stdout.write(args.prompt)
            for token in generate_tokens(ctx, prompt, args.max_tokens, sampler):
                if model.tokenizer.is_eog(token):
                    break
                sys.stdout.write(text.push(model.tokenizer.piece(token))[0])
                sys.stdout.flush()
            sys.stdout.write(text.flush() + "\n")
    return 0


def _prefix_config(args: argparse.Namespace) -> dict:
    return {"prefix_cache": args.prefix_cache, "prefix_slots": args.prefix_slots}


def _latency_config(args: argparse.Namespace) -> dict:
    """Kernels and the latency targets; a target is passed only when given, so an engine without
    that option still opens with the defaults."""
    config: dict = {"batch_invariant": args.batch_invariant}
    for name in ("ttft_slo_ms", "tpot_slo_ms"):
        if getattr(args, name, None) is not None:
            config[name] = getattr(args, name)
    if getattr(args, "shed_late", False):
        config["shed_late"] = True
    if not getattr(args, "slo_scheduling", True):
        config["slo_scheduling"] = False
    if not getattr(args, "run_ahead", True):  # passed only when off, as the targets
        config["run_ahead"] = False
    return config


def _target_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0 < value < float("inf"):  # NaN fails too
        raise argparse.ArgumentTypeError(f"a latency target must be a positive number of ms, got {text!r}")
    return value


def _add_latency_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-ahead", action=argparse.BooleanOptionalAction, default=True,
                        help="while every running stream is written inline, steady decode steps go on from the "
                             "worker thread, each token written as it is sampled (default: on); --no-run-ahead "
                             "wakes the event loop every step (for comparison)")
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                        help="batch-invariant kernels: a request's tokens do not depend on its batch-mates "
                             "(default: on); --no-batch-invariant loads repacked weights and uses the default "
                             "kernels (faster per token, outputs may vary with the batch)")
    parser.add_argument("--ttft-slo-ms", type=_target_ms, default=None, metavar="MS",
                        help="time-to-first-token target: waiting requests go least slack first, and one that "
                             "can no longer make it stops taking budget from those that can (default: 10x the "
                             "request's prompt computed alone on this machine)")
    parser.add_argument("--tpot-slo-ms", "--tpot-target-ms", dest="tpot_slo_ms", type=_target_ms, default=None,
                        metavar="MS", help="time-per-output-token target: each step takes only the prefill the "
                             "running streams' slack allows, and admission stops before one more stream would "
                             "push decodes past it (default: 5x a one-row decode step on this machine; derived "
                             "targets are advisory: they shape steps but hold no request back)")
    parser.add_argument("--shed-late", action="store_true",
                        help="refuse (429 + Retry-After) a request that can no longer meet its TTFT target when its "
                             "turn comes, instead of serving it after the on-time ones (needs --ttft-slo-ms or "
                             "--tpot-slo-ms)")
    parser.add_argument("--slo-scheduling", action=argparse.BooleanOptionalAction, default=True,
                        help="plan steps and admission against the targets (default: on); --no-slo-scheduling "
                             "fills every step up to n_batch and admits by memory alone (for comparison)")


def _bytes(text: str) -> int:
    """'512M', '2G', '1.5GiB' or a plain number of bytes."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[: len(t) - len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 536870912, 512M, 2G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a memory budget must be positive, got {text!r}")
    return int(value)


def _sizing_config(args: argparse.Namespace) -> dict:
    config = {"n_ctx": args.n_ctx, "memory_bytes": args.memory, "floor_ctx_per_session": args.floor_ctx}
    if args.n_seq_max:
        config["n_seq_max"] = args.n_seq_max
    return config


def _add_sizing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-ctx", type=int, default=None,
                        help="cells in the shared KV pool (default: 4096, or derived from --memory)")
    parser.add_argument("--memory", type=_bytes, default=None,
                        help="budget for KV cells and recurrent states, e.g. 512M: sizes the pool and the ceiling")
    parser.add_argument("--floor-ctx", type=int, default=128, help="cells per session the ceiling is derived from")
    parser.add_argument("--n-seq-max", type=int, default=None, help="ceiling on running sequences (default: derived)")
    parser.add_argument("--n-batch", type=int, default=512)


def _plan(args: argparse.Namespace) -> int:
    import json

    from ._plan import context_base, probe_memory
    from .engine import EngineConfig, plan_engine
    from .native import Model

    path = _resolve_checked(args)
    cfg = EngineConfig(**_sizing_config(args), **_prefix_config(args), n_batch=args.n_batch, threads=1,
                       n_gpu_layers=args.n_gpu_layers)
    with Model(path, repack=False, n_gpu_layers=cfg.n_gpu_layers) as model:
        plan, _ = plan_engine(model, cfg)
        memory = probe_memory(model, context_base(cfg.n_batch, cfg.threads, cfg.batch_invariant))
        arch = model.arch

    out = {
        "model": path.name, "arch": arch, "kv_class": memory.kv_class.value, "memory_type": memory.memory_type,
        "n_ctx": plan.n_ctx, "ceiling": plan.ceiling, "n_seq_max": plan.n_seq_max, "reserved_seq_ids": plan.reserved,
        "prefix_budget_tokens": plan.prefix_budget_tokens, "floor_ctx_per_session": cfg.floor_ctx_per_session,
        "bytes": {k.name.lower(): v for k, v in plan.bytes.items() if k in memory.kv_class.components},
        "total_bytes": plan.total_bytes, "memory_bytes": plan.memory_bytes, "limited_by": plan.reason,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    width = max(len(k) for k in out)
    for k, v in out.items():
        if k == "bytes":
            v = ", ".join(f"{c} {n / 2**20:.1f} MiB" for c, n in v.items())
        elif k in ("total_bytes", "memory_bytes") and v is not None:
            v = f"{v} ({v / 2**20:.1f} MiB)"
        print(f"{k:<{width}}  {v}")
    return 0


def _add_prefix_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                        help="share prompt prefixes between requests (default: on)")
    parser.add_argument("--prefix-slots", type=int, default=8, help="resident prefixes kept (reserved sequence ids)")


def _demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    model = _resolve_checked(args)
    config = {"n_batch": args.n_batch, "threads": args.threads, "n_gpu_layers": args.n_gpu_layers,
              **_sizing_config(args), **_prefix_config(args), **_latency_config(args)}
    result = demo_main(model, args.sessions, args.max_tokens, progress=not args.quiet,
                       shared_prefix_tokens=args.shared_prefix_tokens, **config)
    return 0 if result["failed"] == 0 else 1


def _check(args: argparse.Namespace) -> int:
    """The batch-invariance self-check (skippy.check): 0 identical, 1 not identical, 2 error."""
    from .check import check_file, store
    from .native import ensure_built

    ensure_built(progress=False)
    path = _resolve_checked(args)
    result = check_file(path, {"threads": args.threads}, n_gpu_layers=args.n_gpu_layers, sequences=args.sequences,
                        max_tokens=args.max_tokens)
    store(result)  # what `skippy serve --require-invariant` and the engine read
    for line in result.lines():
        print(line)
    return 0 if result.identical else 1


def _serve_config(args: argparse.Namespace) -> dict:
    """The EngineConfig fields `skippy serve` passes to open_engine."""
    return {"n_batch": args.n_batch, "threads": args.threads, "max_waiting": args.max_waiting,
            "n_gpu_layers": args.n_gpu_layers, **_sizing_config(args), **_prefix_config(args), **_latency_config(args)}


def _serve(args: argparse.Namespace) -> int:
    from .engine import open_engine

    _api_tls(args)  # a bad certificate fails before the model is looked at
    model = _resolve_checked(args)
    config = _serve_config(args)
    if args.require_invariant:  # run the self-check (or read its verdict); refuse a model that fails it
        config["verify_invariance"] = "require"
    decision = _scheduler(args, model)
    if decision.scheduler == "single-lane":
        config["n_seq_max"] = 1  # the engine before cutover: one sequence at a time, the rest wait in line
    return _serve_engine(args, lambda: open_engine(model, **config), args.host, args.port,
                         startup=[decision.line()])


def _scheduler(args: argparse.Namespace, model: Path):
    """`--scheduler` resolved by the cutover switch (skippy.cutover); a corrupt verdict file fails
    here, before the port is bound."""
    from .cutover import resolve
    from .native._gguf_check import check_gguf

    decision = resolve(args.scheduler, model, check_gguf(model), args.threads, args.n_gpu_layers)
    logger.info("{}", decision.line())
    return decision


def _gate(args: argparse.Namespace) -> int:
    """The CI-sized cutover gate on this machine (skippy._gate): 0 PASS, 1 FAIL, 2 error; the verdict
    is stored where `skippy serve --scheduler auto` reads it."""
    from ._gate import run_gate
    from .cutover import store_verdict, verdict_summary
    from .native import ensure_built
    from .native._gguf_check import check_gguf

    ensure_built(progress=False)
    model = _resolve_checked(args)
    say = (lambda line: None) if args.quiet else (lambda line: print(f"skippy gate: {line}", file=sys.stderr,
                                                                     flush=True))
    verdict = run_gate(model, check_gguf(model), threads=args.threads, sessions=args.sessions,
                       max_tokens=args.max_tokens, rounds=args.rounds, say=say)
    path = store_verdict(verdict)
    for line in verdict_summary(verdict, path):
        print(line)
    return 0 if verdict.passed else 1


def _alias(args: argparse.Namespace) -> str | None:
    from .models._store import DEFAULT_MODEL, REAL_MODELS

    return args.model if args.model in REAL_MODELS else (args.family or (DEFAULT_MODEL if args.model is None else None))


def _api_keys(args: argparse.Namespace) -> list[str]:
    """--api-key (repeatable), else $SKIPPY_API_KEY (keeps the key out of the process list), else none."""
    import os

    env = os.environ.get("SKIPPY_API_KEY", "")
    keys = args.api_key or ([env] if env else [])
    if any(not k for k in keys):
        raise SkippyError("--api-key must not be empty")
    return keys


def _serve_engine(args: argparse.Namespace, opener, host: str, port: int, startup: Sequence[str] = ()) -> int:
    """Serve the OpenAI API over the engine `opener()` opens, until SIGINT/SIGTERM. The port is bound
    first: while the model loads every route answers 503 (server.loading), so a router or a readiness
    probe sees a replica that is loading, not one that is gone. `startup`: lines said once it serves."""
    import trio

    from .server import HttpLimits, LoadingGate, create_app, default_model_names, serve_app, wait_for_signal

    tls = _api_tls(args)
    keys = _api_keys(args)

    async def main() -> None:
        gate = LoadingGate()
        served = trio.Event()  # serve_app returned: a signal came (and what was in flight is drained)

        async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                await serve_app(gate, host, port, shutdown_trigger=wait_for_signal, deadline=args.shutdown_deadline,
                                limits=HttpLimits(max_body_bytes=args.max_body_bytes), task_status=task_status,
                                **tls)
            finally:
                served.set()

        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve)
            with trio.CancelScope() as loading:
                nursery.start_soon(_cancel_on, served, loading)  # a signal while loading: stop loading
                async with opener() as engine:
                    names = ([args.served_model_name] if args.served_model_name else []) + default_model_names(
                        engine, [_alias(args), *args.alias])
                    gate.open(create_app(engine, model_names=names, api_keys=keys, inline_writes=args.inline_writes))
                    print(f"skippy: serving {names[0]} on {', '.join(binds)} (Ctrl-C to stop)", file=sys.stderr,
                          flush=True)
                    for line in startup:
                        print(f"skippy: {line}", file=sys.stderr, flush=True)
                    if (targets := engine.latency_targets()) is not None:
                        print(f"skippy: latency targets: {targets}", file=sys.stderr, flush=True)
                    await served.wait()
            nursery.cancel_scope.cancel()
        print("skippy: stopped", file=sys.stderr, flush=True)

    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # the server's nursery wraps what the opener raised: say it alone
        leaf = _only_leaf(group)
        if leaf is None:
            raise
        raise leaf from None
    return 0


async def _cancel_on(event, scope) -> None:
    await event.wait()
    scope.cancel()


def _only_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside nested single-member groups, or None if there are several."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


def _api_tls(args: argparse.Namespace) -> dict:
    """--tls-cert/--tls-key of the API (HTTPS), checked before any model loads."""
    from .server.serve import check_tls_files

    check_tls_files(args.tls_cert, args.tls_key)
    return {"certfile": args.tls_cert, "keyfile": args.tls_key}


def _next_tls(args: argparse.Namespace):
    """--tls-ca (and --tls-server-name): reach the next stage over TLS, checking its certificate."""
    from .staged._tls import StageTLSError, client_tls

    if args.tls_ca is None:
        if args.tls_server_name:
            raise StageTLSError("--tls-server-name names the next stage's certificate: it needs --tls-ca")
        return None
    return client_tls(args.tls_ca, args.tls_server_name)


def _pipeline_tls(args: argparse.Namespace):
    """`skippy pipeline`: the next-stage TLS of stage 0, and the TLS options of the stages it starts
    (with --tls-ca they present --tls-cert/--tls-key and check their next against the CA)."""
    from .staged._tls import StageTLSError, server_context

    _api_tls(args)
    next_tls = _next_tls(args)
    if next_tls is None:
        return None, []
    if args.tls_cert is None:
        raise StageTLSError("--tls-ca puts the stage links on TLS: the stages need --tls-cert and --tls-key")
    server_context(args.tls_cert, args.tls_key)
    options = ["--tls-cert", str(args.tls_cert), "--tls-key", str(args.tls_key), "--tls-ca", str(args.tls_ca)]
    return next_tls, options + (["--tls-server-name", args.tls_server_name] if args.tls_server_name else [])


def _cluster(args: argparse.Namespace) -> int:
    """K `skippy serve` replicas behind sglang-router (skippy.cluster); the flags it does not know are
    each replica's serve flags, checked here as `skippy serve` would before anything starts."""
    from .cluster.command import run_command

    serve_args = list(args.serve_args)
    if serve_args[:1] == ["--"]:  # `skippy cluster ... -- SERVE FLAGS` works too
        serve_args = serve_args[1:]
    serve = _parser().parse_args(["serve", *serve_args])
    return run_command(args, serve_args, serve)


def _layer_range(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not sep or not a.isdigit() or not b.isdigit() or int(a) >= int(b):
        raise argparse.ArgumentTypeError(f"expected A:B with A < B, got {text!r}")
    return int(a), int(b)


def _stage_options(args: argparse.Namespace) -> dict:
    return {"n_ctx": args.n_ctx, "n_batch": args.n_batch, "n_seq_max": args.n_seq_max,
            "memory_bytes": args.memory, "threads": args.threads, "floor_ctx_per_session": args.floor_ctx}


def _pipeline_config(args: argparse.Namespace) -> dict:
    return {"n_batch": args.n_batch, "threads": args.threads, "max_waiting": args.max_waiting,
            **_sizing_config(args), "micro_batches": args.micro_batches, "wire_dtype": args.wire_dtype,
            "groups": args.groups}


def _stage_secret(args: argparse.Namespace) -> bytes | None:
    """--secret-file, else $SKIPPY_STAGE_SECRET, else none."""
    from .staged._auth import load_secret

    return load_secret(args.secret_file)


def _stage(args: argparse.Namespace) -> int:
    """A stage of a pipeline: layers [A, B). Stage 0 (A = 0) serves the OpenAI API on --listen."""
    from functools import partial

    import trio

    from .server import wait_for_signal
    from .staged._auth import ENV_VAR, is_loopback
    from .staged._pipeline import open_pipeline, parse_addr
    from .staged._stage import StageRuntime, serve_stage
    from .staged._tls import pair, server_context

    a, b = args.layers
    host, port = parse_addr(args.listen)
    next_addr = parse_addr(args.next) if args.next else None
    secret = _stage_secret(args)
    if a > 0 and secret is None and not args.insecure and not is_loopback(host):
        raise SkippyError(f"refusing to listen on {host} without a stage secret: give --secret-file PATH (or "
                          f"${ENV_VAR}) to every stage, or --insecure on a network you trust")
    # stage 0: --tls-cert/--tls-key are the API's (HTTPS); later stages serve their link over TLS
    tls = server_context(args.tls_cert, args.tls_key) if a > 0 and pair(args.tls_cert, args.tls_key) else None
    if a == 0:
        _api_tls(args)  # checked before the model loads
    next_tls = _next_tls(args)
    path = _resolve_checked(args)
    if a == 0:
        if next_addr is None:
            raise SkippyError("stage 0 hands its activations down: give --next HOST:PORT (or use skippy serve)")
        config = _pipeline_config(args)
        return _serve_engine(args, lambda: open_pipeline(path, b, next_addr, secret=secret, tls=next_tls, **config),
                             host, port)
    runtime = StageRuntime(path, (a, b), **_stage_options(args))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(partial(serve_stage, runtime, host, port, next_addr, secret=secret, tls=tls,
                                                next_tls=next_tls,
                                                on_session_end=lambda stats: print(stats.line(), flush=True)))
            print(f"skippy stage: listening on {host}:{bound}", flush=True)
            await wait_for_signal()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        runtime.close()
    return 0


def _pipeline(args: argparse.Namespace) -> int:
    """K stage processes on loopback; this process is stage 0 and serves the OpenAI API."""
    from .native import Model
    from .staged import balanced_split, layer_costs, validate_split
    from .staged._auth import new_secret
    from .staged._launch import launch_stages
    from .staged._layout import file_boundary_rule
    from .staged._pipeline import open_pipeline, parse_addr

    next_tls, tls_options = _pipeline_tls(args)
    path = _resolve_checked(args)
    with Model(path, repack=False, layers=(0, 1)) as probe:  # n_layer and arch without the weights
        n_layer, arch = probe.n_layer, probe.arch
    allowed = file_boundary_rule(path, arch)  # hybrid families: the file's own attention layers
    if args.layers:
        splits = [_layer_range(part) for part in args.layers.split(",")]
        validate_split(splits, n_layer, allowed=allowed)
    else:
        per_layer, head = layer_costs(path)  # equal compute per stage, the output head on the last
        splits = balanced_split(per_layer, head, args.stages, allowed=allowed)
    options = ["--n-batch", str(args.n_batch), "--threads", str(args.threads), "--floor-ctx", str(args.floor_ctx)]
    options += ["--n-ctx", str(args.n_ctx)] if args.n_ctx else []
    options += ["--memory", str(args.memory)] if args.memory else []
    options += ["--n-seq-max", str(args.n_seq_max)] if args.n_seq_max else []
    options += tls_options
    # the stages listen on loopback, where any local user could connect: they always share a
    # secret, the user's (--secret-file / $SKIPPY_STAGE_SECRET) or a fresh one for this run
    secret = _stage_secret(args)
    fresh = None
    if args.secret_file:
        options += ["--secret-file", str(args.secret_file)]
    elif secret is None:
        fresh = new_secret()
        secret = fresh.encode()
    print(f"skippy: starting {len(splits)} stages: {', '.join(f'[{a}, {b})' for a, b in splits)}", file=sys.stderr)
    stages = launch_stages(path, splits, options=options, secret=fresh)
    try:
        config = _pipeline_config(args)
        next_addr = parse_addr(stages[0].addr)
        return _serve_engine(args, lambda: open_pipeline(path, splits[0][1], next_addr, secret=secret, tls=next_tls,
                                                         **config), args.host, args.port)
    finally:
        for stage in stages:
            stage.stop()


# skippy.models.synth.FAMILIES, spelled out: importing it (gguf, numpy) would slow every command
SYNTH_FAMILIES = ("llama, gemma2, deepseek2, falcon-h1, qwen3next, qwen2, qwen3, qwen3moe, phi3, mamba2, granite, "
                  "olmo2, starcoder2, gpt-oss")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", help="GGUF path or real model name (default: the embedded SmolLM2)")
    where.add_argument("--family", help=f"a tiny synthetic model: {SYNTH_FAMILIES}")


def _gpu_layers(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of layers: {text!r} (-1: all)") from None


def _add_gpu_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-gpu-layers", type=_gpu_layers, default=0, metavar="N",
                        help="layers on the GPU (-1: all; default 0); needs `skippy build --cuda`, a CPU build runs "
                             "them on the CPU. Batch invariance is then the self-check's verdict, not a guarantee")


def _add_server_options(parser: argparse.ArgumentParser, who: str = "") -> None:
    parser.add_argument("--served-model-name", default=None,
                        help=f"{who}the model id clients use (default: the file name)")
    parser.add_argument("--alias", action="append", default=[],
                        help=f"{who}another name the model answers to in 'model' (repeatable; listed in /v1/models)")
    parser.add_argument("--api-key", action="append", default=None,
                        help=f"{who}require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                             "(repeatable; default: $SKIPPY_API_KEY, else no auth)")
    parser.add_argument("--max-waiting", type=int, default=256, help=f"{who}waiting-queue bound; past it: HTTP 429")
    parser.add_argument("--max-body-bytes", type=_bytes, default=8 << 20, metavar="BYTES",
                        help=f"{who}largest request body (e.g. 8M, the default); a larger one is answered 413 "
                             "before it is read")
    parser.add_argument("--shutdown-deadline", type=float, default=30.0,
                        help=f"{who}seconds in-flight requests may take to finish after SIGINT/SIGTERM")
    parser.add_argument("--inline-writes", action=argparse.BooleanOptionalAction, default=True,
                        help=f"{who}write a streamed token's bytes from the engine step that produced it while "
                             "the next step computes, on plain-TCP HTTP/1.x (default: on); --no-inline-writes sends "
                             "every chunk through the response's task and the ASGI stack (for comparison)")


def _add_pipeline_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="parts each step is cut into so the stages overlap (default: the number of stages)")
    parser.add_argument("--wire-dtype", choices=["f32", "f16"], default="f32",
                        help="hidden states on the wire; f16 halves the bytes but is not bit-exact")
    parser.add_argument("--groups", type=int, default=1,
                        help="engines at stage 0 whose steps interleave in the pipeline (sessions, lanes and "
                             "stage-0 cells split across them); fills the bubble at the step boundary")


def _add_secret_option(parser: argparse.ArgumentParser, who: str) -> None:
    parser.add_argument("--secret-file", type=Path, default=None, metavar="PATH",
                        help=f"{who} (default: $SKIPPY_STAGE_SECRET); every stage of a pipeline needs the same one")


def _add_tls_options(parser: argparse.ArgumentParser, cert_help: str, *, links: bool = True) -> None:
    parser.add_argument("--tls-cert", type=Path, default=None, metavar="PATH", help=f"{cert_help} (PEM, with --tls-key)")
    parser.add_argument("--tls-key", type=Path, default=None, metavar="PATH", help="the private key of --tls-cert (PEM)")
    if links:
        parser.add_argument("--tls-ca", type=Path, default=None, metavar="PATH",
                            help="reach the next stage over TLS, trusting only the CA certificate(s) in PATH")
        parser.add_argument("--tls-server-name", default=None, metavar="NAME",
                            help="the name the next stage's certificate must carry (default: its --next host)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skippy", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO (llama.cpp's own log: SKIPPY_LLAMA_LOG)")
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="fetch, patch and build llama.cpp and the cffi extension (cached)")
    build.add_argument("--tools", action="store_true", help="also build llama-server and llama-batched-bench")
    build.add_argument("--cuda", action="store_true", help="build with CUDA (needs nvcc)")
    build.add_argument("--portable", action="store_true", help="GGML_NATIVE off: no -march=native")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=_build)

    models = sub.add_parser("models", help="model files").add_subparsers(dest="models_command", required=True)
    synth_p = models.add_parser("synth", help="write a synthetic model of an architecture (tiny, or --size base)")
    synth_p.add_argument("family", help=SYNTH_FAMILIES)
    synth_p.add_argument("--seed", type=int, default=0)
    synth_p.add_argument("--size", choices=("tiny", "base"), default="tiny",
                         help="tiny (default, a few MB) or base: the dims of a small real model of the family, "
                              "~300M params, Q4_K_M (deepseek2, falcon-h1, qwen3next; about a minute, cached)")
    synth_p.add_argument("--out", type=Path)
    synth_p.set_defaults(func=_synth)
    fetch_p = models.add_parser("fetch", help="fetch a real model (smollm2, gemma3) into the cache")
    fetch_p.add_argument("name", nargs="?", default="smollm2")
    fetch_p.set_defaults(func=_fetch)

    gen = sub.add_parser("generate", help="generate text from a prompt (greedy unless --temperature)")
    gen.add_argument("prompt")
    _add_model_options(gen)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--threads", type=int, default=2)
    _add_gpu_option(gen)
    gen.set_defaults(func=_generate)

    demo = sub.add_parser("demo", help="N concurrent sessions through one engine; ends with one JSON line")
    _add_model_options(demo)
    demo.add_argument("--sessions", type=int, default=16)
    demo.add_argument("--max-tokens", type=int, default=32)
    demo.add_argument("--threads", type=int, default=2)
    _add_sizing_options(demo)
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.add_argument("--shared-prefix-tokens", type=int, default=0,
                      help="every session's prompt starts with the same K tokens (a system prompt)")
    _add_prefix_options(demo)
    _add_latency_options(demo)
    _add_gpu_option(demo)
    demo.set_defaults(func=_demo)

    plan = sub.add_parser("plan", help="the lane plan the engine would use: pool cells, ceiling, bytes per component")
    _add_model_options(plan)
    _add_sizing_options(plan)
    _add_prefix_options(plan)
    plan.add_argument("--json", action="store_true", help="one JSON line")
    _add_gpu_option(plan)
    plan.set_defaults(func=_plan)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)")
    _add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--threads", type=int, default=2)
    _add_sizing_options(serve)
    _add_server_options(serve)
    _add_prefix_options(serve)
    _add_latency_options(serve)
    serve.add_argument("--require-invariant", action="store_true",
                       help="run the batch-invariance self-check first (or read its cached verdict) and refuse "
                            "to serve a model that fails it (exit 2)")
    serve.add_argument("--scheduler", choices=("auto", "batched", "single-lane"), default="auto",
                       help="batched (continuous batching), single-lane (one sequence at a time: the engine before "
                            "cutover), or auto (default): batched where the model's class passed the cutover gate "
                            "(`skippy gate`'s verdict for this model here, else the shipped table), single-lane "
                            "otherwise; the startup line says which and why")
    _add_tls_options(serve, "serve HTTPS with this certificate", links=False)
    _add_gpu_option(serve)
    serve.set_defaults(func=_serve)

    gate = sub.add_parser("gate", help="a CI-sized cutover gate for a model on this machine; writes the verdict "
                                       "`serve --scheduler auto` honours (exit 0 PASS, 1 FAIL, 2 error)")
    _add_model_options(gate)
    gate.add_argument("--threads", type=int, default=2, help="threads (as the server will run; part of the verdict)")
    gate.add_argument("--sessions", type=int, default=8, help="concurrent sessions of the throughput row (N)")
    gate.add_argument("--max-tokens", type=int, default=48, help="tokens per session")
    gate.add_argument("--rounds", type=int, default=2, help="interleaved rounds per engine; the median counts")
    gate.add_argument("--quiet", action="store_true", help="no progress lines")
    gate.set_defaults(func=_gate)

    check = sub.add_parser("check", help="self-check: N concurrent sequences give the same logits bits as alone "
                                         "(exit 0 identical, 1 not identical, 2 error)")
    _add_model_options(check)
    check.add_argument("--threads", type=int, default=2, help="threads (as the server will run; part of the verdict)")
    check.add_argument("--sequences", type=int, default=8)
    check.add_argument("--max-tokens", type=int, default=32)
    _add_gpu_option(check)
    check.set_defaults(func=_check)

    stage = sub.add_parser("stage", help="one stage of a pipeline: layers A:B on --listen, handing down to --next")
    _add_model_options(stage)
    stage.add_argument("--layers", type=_layer_range, required=True, help="A:B, this stage's layers [A, B)")
    stage.add_argument("--listen", required=True,
                       help="HOST:PORT; stage 0 serves the OpenAI API there, later stages the next stage's link")
    stage.add_argument("--next", default=None, help="HOST:PORT of the next stage (none for the last)")
    _add_secret_option(stage, "the stage secret: upstream must prove it (HMAC challenge-response) and this stage "
                              "proves it to the next")
    stage.add_argument("--insecure", action="store_true",
                       help="listen on a non-loopback address without a stage secret (a trusted network only)")
    _add_tls_options(stage, "stage 0: serve the API over HTTPS; later stages: serve the link on --listen over TLS")
    stage.add_argument("--threads", type=int, default=2)
    _add_sizing_options(stage)
    _add_server_options(stage, "stage 0: ")
    _add_pipeline_options(stage)
    stage.set_defaults(func=_stage)

    pipe = sub.add_parser("pipeline", help="K stage processes on loopback, the OpenAI API served from stage 0")
    _add_model_options(pipe)
    pipe.add_argument("--stages", type=int, default=2,
                      help="stages (about equal compute each, the output head counted; family cut rules kept)")
    pipe.add_argument("--layers", default=None, help="explicit split, e.g. 0:10,10:20,20:30 (overrides --stages)")
    pipe.add_argument("--host", default="127.0.0.1", help="bind address of the API (default: loopback only)")
    pipe.add_argument("--port", type=int, default=8080)
    pipe.add_argument("--threads", type=int, default=2, help="threads per stage")
    _add_secret_option(pipe, "the stage secret the stages share (default: a fresh random one per run)")
    _add_tls_options(pipe, "serve the API over HTTPS; with --tls-ca the stages present it on their TLS links too")
    _add_sizing_options(pipe)
    _add_server_options(pipe)
    _add_pipeline_options(pipe)
    pipe.set_defaults(func=_pipeline)

    from .cluster.command import add_parser as add_cluster_parser  # argparse only: light to import

    add_cluster_parser(sub).set_defaults(func=_cluster, serve_args=[])
    return parser


def _expected(exc: BaseException) -> list[BaseException] | None:
    """The failures a user can act on inside `exc` (a trio nursery wraps them in exception
    groups): every leaf a SkippyError or an OSError (a file, a port). None if any leaf is not:
    that is a bug in skippy, and its traceback is worth seeing."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_expected(e) for e in exc.exceptions]
        return None if any(leaf is None for leaf in leaves) else [e for leaf in leaves for e in leaf or ()]
    return [exc] if isinstance(exc, (SkippyError, OSError)) else None


def _one_line(exc: BaseException) -> str:
    """A failure as one line: a multi-line message (a probe's child log) is joined with ' | '."""
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # only `skippy cluster` passes flags on (to its replicas' `skippy serve`)
        if args.command != "cluster":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.serve_args = unknown
    logger.enable("skippy")
    logger.remove()
    logger.add(sys.stderr, level="INFO" if args.verbose else "WARNING")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        failures = _expected(exc)
        if failures is None:
            raise
        for failure in dict.fromkeys(_one_line(f) for f in failures):  # one line each, duplicates once
            print(f"skippy: error: {failure}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
