"""Batch-invariance self-check: on the user's model and this native build, does every sequence
get the same logits bits under load as alone?

Why: batch invariance is a property of the kernels a model's tensors hit (weight types,
attention variant, memory type), so a model llama.cpp loads but our tests never ran can break
it silently. The check runs N sequences together on one context (all in one batch; then
staggered arrivals, prompt chunks of 1 to 64 tokens mixed with decodes, and half the sequences
sharing a prefix through seq_cp) and compares every logits row with the same prompt run alone
(skippy._lockstep, the driver of the invariance tests). Verdicts are cached per (model file
sha256, native build, options that matter) under <cache>/checks/; the engine reads them at
open (EngineConfig.verify_invariance) and `skippy check` / `skippy serve --require-invariant`
run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np
from loguru import logger

from ._cache import cache_root
from ._lockstep import Result, Seq, alone, run
from .errors import InvalidInputError, SkippyError
from .native import Context, ContextOptions, Model

CHECK_VERSION = 1  # bump when the workload changes: cached verdicts are then stale
CHUNKS = (1, 7, 16, 64)  # prefill chunk sizes, cycled over the staggered sequences
PREFIX = 24  # tokens the sharing sequences have in common (seq_cp from a spare sequence id)
N_BATCH = 512  # the check's own batch (and ubatch) size: the one-batch scenario fills it
MODES = ("off", "cached", "run", "require")


class InvarianceError(SkippyError):
    """The model is not batch-invariant on this build (or its check could not run) and the caller required it."""


@attrs.frozen
class Difference:
    """Where a sequence first left its solo run."""

    sequence: int
    token_index: int  # the generated token whose logits row first differs
    position: int  # that row's position in the sequence (prompt + tokens before it)
    tokens_differ: bool  # the greedy tokens diverged too, not only logits bits


@attrs.frozen
class Verdict:
    """One scenario: how many of its sequences differ from their solo runs, and the first that does."""

    scenario: str
    sequences: int
    tokens: int  # logits rows compared
    differing: int = 0
    first: Difference | None = None

    @property
    def identical(self) -> bool:
        return self.differing == 0

    def line(self) -> str:
        what = f"{self.scenario}: {self.sequences} sequences, {self.tokens} logits rows"
        if self.identical:
            return f"identical      {what}"
        d = self.first
        assert d is not None
        kind = "tokens and logits" if d.tokens_differ else "logits"
        return (f"NOT identical  {what}: {self.differing} differ; first sequence {d.sequence}, "
                f"{kind} at token {d.token_index} (position {d.position})")


@attrs.frozen
class CheckResult:
    model: str  # the file's name
    arch: str
    key: str  # the cache key: model sha256, native build, options, workload
    options: Mapping[str, Any]  # the context options that matter (cache_fields)
    verdicts: tuple[Verdict, ...]
    seconds: float
    cached: bool = False  # read from the cache, not run now

    @property
    def identical(self) -> bool:
        return all(v.identical for v in self.verdicts)

    def lines(self) -> list[str]:
        """One line per verdict, then the summary."""
        state = "identical" if self.identical else "NOT identical"
        source = "cached" if self.cached else f"{self.seconds:.1f}s"
        return [v.line() for v in self.verdicts] + [f"{self.model} ({self.arch}): {state} to solo runs ({source})"]

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self, filter=lambda a, _: a.name != "cached"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CheckResult":
        d = json.loads(text)
        verdicts = tuple(Verdict(**{**v, "first": Difference(**v["first"]) if v["first"] else None})
                         for v in d.pop("verdicts"))
        return cls(**d, verdicts=verdicts, cached=True)


# -- the check ----------------------------------------------------------------------------


def cache_fields(options: ContextOptions) -> dict[str, Any]:
    """The context options a verdict depends on (the pool and the lane count are the check's own)."""
    return {"batch_invariant": options.batch_invariant, "flash_attn": options.flash_attn,
            "swa_full": options.swa_full, "kv_unified": options.kv_unified, "threads": options.threads}


def check_options(options: ContextOptions | Mapping[str, Any] | None, sequences: int, per_seq: int) -> ContextOptions:
    """The check's context: the caller's options that matter, with its own pool, lanes and batch."""
    if isinstance(options, ContextOptions):
        options = cache_fields(options)
    base = {"batch_invariant": True, "threads": 2, **(options or {})}
    cells = (sequences + 1) * per_seq
    return ContextOptions(**{**base, "n_ctx": -(-cells // 256) * 256, "n_seq_max": sequences + 1,
                             "n_batch": N_BATCH, "n_ubatch": N_BATCH})


def run_check(model: Model, options: ContextOptions | Mapping[str, Any] | None = None, *, sequences: int = 8,
              max_tokens: int = 32, seed: int = 0) -> CheckResult:
    """Run the workload on `model` under `options` (ContextOptions or a dict of its fields;
    default batch-invariant, 2 threads) and compare every sequence with its solo run."""
    if not 2 <= sequences <= 64 or not 1 <= max_tokens <= 256:
        raise InvalidInputError(f"a check runs 2 to 64 sequences of 1 to 256 tokens, got {sequences} x {max_tokens}")
    started = time.monotonic()
    prompts, shared = _workload(model.n_vocab, sequences, seed)
    opts = check_options(options, sequences, max(p.size for p in prompts) + max_tokens)
    with Context(model, opts) as ctx:
        refs = [alone(ctx, p, max_tokens) for p in prompts]
        verdicts = (_one_batch(ctx, prompts, refs, max_tokens), _staggered(ctx, prompts, shared, refs, max_tokens))
    key = cache_key(model.path, opts, sequences, max_tokens, seed, n_gpu_layers=_gpu_layers(model))
    return CheckResult(model.path.name, model.arch, key, cache_fields(opts), verdicts, time.monotonic() - started)


def check_file(path: os.PathLike[str] | str, options: Mapping[str, Any] | None = None, *, n_gpu_layers: int = 0,
               **workload: int) -> CheckResult:
    """run_check on a GGUF file, loaded as the engine would: without repacked weights when invariant,
    `n_gpu_layers` layers on a GPU when the build has one."""
    invariant = bool((options or {}).get("batch_invariant", True))
    with Model(Path(path), repack=not invariant, n_gpu_layers=n_gpu_layers) as model:
        return run_check(model, options, **workload)


def _workload(n_vocab: int, sequences: int, seed: int) -> tuple[list[np.ndarray], set[int]]:
    """Seeded random prompts of 4 to 40 tokens; the odd sequences start with one shared prefix."""
    rng = np.random.default_rng(seed)
    low, high = min(1000, n_vocab // 2), min(20000, n_vocab)  # clear of the specials and byte tokens
    lengths = rng.permutation(np.linspace(4, 40, sequences).astype(int))
    prefix = rng.integers(low, high, size=PREFIX)
    shared = set(range(1, sequences, 2))
    prompts = [np.concatenate([prefix, own]) if i in shared else own
               for i, own in enumerate(rng.integers(low, high, size=n) for n in lengths)]
    return [p.astype(np.int32) for p in prompts], shared


def _one_batch(ctx: Context, prompts: list[np.ndarray], refs: list[Result], max_tokens: int) -> Verdict:
    """Every sequence arrives at once: their prompts share one ubatch, then their decodes do."""
    ctx.clear()
    chunk = ctx.n_batch // len(prompts)
    results = run(ctx, [Seq(p, i, chunk=chunk) for i, p in enumerate(prompts)], max_tokens)
    return _compare("one batch", prompts, results, refs)


def _staggered(ctx: Context, prompts: list[np.ndarray], shared: set[int], refs: list[Result],
               max_tokens: int) -> Verdict:
    """Arrivals two steps apart, chunks of 1 to 64 mixed with decodes, and the shared prefix
    prefilled once on a spare sequence id, copied into the sharers with seq_cp, then freed."""
    ctx.clear()
    spare = len(prompts)
    run(ctx, [Seq(prompts[min(shared)][:PREFIX], spare)], 1)  # the prefix alone; its one token is not fed back
    for i in sorted(shared):
        ctx.seq_cp(spare, i)
    ctx.seq_rm(spare)
    seqs = [Seq(p, i, arrival=2 * i, chunk=CHUNKS[i % len(CHUNKS)], start=PREFIX if i in shared else 0)
            for i, p in enumerate(prompts)]
    return _compare("staggered + seq_cp prefix", prompts, run(ctx, seqs, max_tokens), refs)


def _compare(scenario: str, prompts: list[np.ndarray], results: list[Result], refs: list[Result]) -> Verdict:
    diffs = [d for i, (p, r, ref) in enumerate(zip(prompts, results, refs))
             if (d := _first_difference(i, p.size, r, ref)) is not None]
    tokens = sum(len(ref.tokens) for ref in refs)
    return Verdict(scenario, len(prompts), tokens, len(diffs), diffs[0] if diffs else None)


def _first_difference(i: int, prompt_size: int, got: Result, want: Result) -> Difference | None:
    for k, (a, b) in enumerate(zip(got.rows, want.rows)):
        if not np.array_equal(a, b):  # bit-exact (NaN rows compare unequal: a NaN is a failure too)
            return Difference(i, k, prompt_size - 1 + k, got.tokens[k] != want.tokens[k])
    if len(got.tokens) != len(want.tokens):
        k = min(len(got.tokens), len(want.tokens))
        return Difference(i, k, prompt_size - 1 + k, True)
    return None


# -- the cache ----------------------------------------------------------------------------


def cache_dir() -> Path:
    return cache_root() / "checks"


def build_id() -> str:
    """The native build the verdict was reached on: its cache key (pin, patches, flags) and
    extension digest; a development tree by its library's mtime."""
    from .native._build import dev_tree, extension_digest, locate

    build = locate()
    if dev_tree() is not None:
        return f"dev-{(build.lib_dir / 'libllama.so').stat().st_mtime_ns}-{extension_digest()}"
    return f"{build.root.name}-{extension_digest()}"


def file_sha256(path: Path) -> str:
    """The file's sha256, remembered per (path, size, mtime) in the cache: a large model is read once."""
    path = Path(path).resolve()
    st = path.stat()
    memo = cache_dir() / "digests.json"
    ident = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if ident not in known:
        with open(path, "rb") as fh:
            known[ident] = hashlib.file_digest(fh, "sha256").hexdigest()
        try:
            _write_atomic(memo, json.dumps(known, indent=1, sort_keys=True))
        except OSError as exc:  # a read-only cache only costs hashing again next time
            logger.debug("could not remember the digest of {}: {}", path.name, exc)
    return known[ident]


def cache_key(path: Path, options: ContextOptions, sequences: int, max_tokens: int, seed: int,
              n_gpu_layers: int = 0) -> str:
    """`n_gpu_layers`: layers a GPU ran (0 on a CPU build, whatever was asked): a GPU's kernels
    get their own verdict, and CPU verdicts keep the keys they had before offload existed."""
    what = {"model": file_sha256(path), "build": build_id(), "options": cache_fields(options),
            "workload": [CHECK_VERSION, sequences, max_tokens, seed]}
    if n_gpu_layers:
        what["n_gpu_layers"] = n_gpu_layers
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def cached(model: Model, options: ContextOptions | Mapping[str, Any] | None = None, *, sequences: int = 8,
           max_tokens: int = 32, seed: int = 0) -> CheckResult | None:
    """The stored verdict for this model, build, options and workload, or None."""
    opts = check_options(options, sequences, 1)
    path = cache_dir() / f"{cache_key(model.path, opts, sequences, max_tokens, seed, _gpu_layers(model))}.json"
    try:
        return CheckResult.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        logger.warning("ignoring an unreadable invariance verdict {}: {}", path, exc)
        return None


def _gpu_layers(model: Model) -> int:
    """The layers `model` really has on a GPU, as far as the verdict goes: 0 unless offloaded."""
    from .native._devices import offloads

    n = getattr(model, "n_gpu_layers", 0)
    return n if offloads(n) else 0


def store(result: CheckResult) -> None:
    """Keep a verdict for later opens; a cache that cannot be written only costs a rerun."""
    try:
        _write_atomic(cache_dir() / f"{result.key}.json", result.to_json())
    except OSError as exc:
        logger.warning("could not cache the invariance verdict: {}", exc)


def cached_or_run(model: Model, options: ContextOptions | Mapping[str, Any] | None = None,
                  **workload: int) -> CheckResult:
    """The stored verdict, else run the check now and store it."""
    found = cached(model, options, **workload)
    if found is None:
        found = run_check(model, options, **workload)
        store(found)
    return found


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- at engine open -----------------------------------------------------------------------


def verify_at_open(model: Model, options: ContextOptions, mode: str, *, invariant: bool = True) -> CheckResult | None:
    """What an engine knows of its model's batch invariance on the context it opened (`options`),
    per EngineConfig.verify_invariance: "off" nothing; "cached" a stored verdict only (never runs
    the check: opens stay fast); "run" the stored verdict or the check now; "require" the same,
    and InvarianceError unless identical. An engine that does not ask for invariant kernels
    (`invariant` False) is not checked. A model with layers on a GPU (n_gpu_layers on a GPU
    build) is checked under "cached" too: those kernels carry no guarantee, so the engine
    reports what the check finds instead of assuming it. Blocking (seconds on a small model): call it off the event loop."""
    if mode not in MODES:
        raise InvalidInputError(f"verify_invariance must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "require" and not invariant:
        raise InvarianceError("requiring batch invariance needs batch-invariant kernels (not --no-batch-invariant)")
    if mode == "off" or not invariant:
        return None
    offloaded = _gpu_layers(model) != 0
    if offloaded and mode == "cached":  # a GPU's kernels are not made invariant: find out rather than assume
        mode = "run"
    try:
        result = cached(model, options) if mode == "cached" else cached_or_run(model, options)
    except (SkippyError, OSError) as exc:
        if mode == "require":
            raise InvarianceError(f"the batch-invariance check of {model.path.name} could not run: {exc}") from exc
        logger.warning("the batch-invariance check of {} could not run: {}", model.path.name, exc)
        return None
    if result is None:
        logger.info("batch invariance of {} is unverified: run `skippy check --model {}`", model.path.name, model.path)
    elif not result.identical:
        first = next(v for v in result.verdicts if not v.identical)
        if mode == "require":
            raise InvarianceError(f"{model.path.name} is not batch-invariant on this build: {first.line()}")
        logger.warning("{} is not batch-invariant on this build ({}): outputs may depend on the batch",
                       model.path.name, first.line())
    elif offloaded:
        logger.warning("{} has layers on a GPU: batch invariance is not guaranteed there; the self-check found "
                       "its outputs identical to solo runs on its workload (Engine.invariance)", model.path.name)
    return result
