"""The per-class cutover switch: which scheduler `skippy serve --scheduler auto` runs.

Why: the seed moves a KV class onto the batched scheduler only once that class has passed the
cutover gate; until then it keeps the single-lane engine (one sequence at a time, the old
behaviour). Two sources decide, in this order:

1. a verdict that `skippy gate` reached for this model file on this machine (a CI-sized gate:
   <cache>/gate/<model sha256>-<hardware>.json), when it matches the model, the hardware and
   the gate's version; a stale or foreign one is ignored with a log line, a corrupt one refused
   (GateVerdictError: the user deletes it or runs `skippy gate` again, never a traceback);
2. the shipped table: the class's verdict in the committed gate matrix (bench/results/gate-matrix).

Pure policy (`decide`) apart from the file and hardware plumbing below it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
import attrs
from loguru import logger

from ._cache import cache_root
from .errors import SkippyError

SCHEDULERS = ("auto", "batched", "single-lane")
GATE_VERSION = 1  # bump when the CI-sized gate's workload or thresholds change: older verdicts go stale

# The gate matrix's classes by architecture (bench/gate/matrix.py runs one model per class). The
# ledger's KvClass cannot tell latent attention or the two hybrid mixers apart; the gate can.
GATE_CLASSES: dict[str, str] = {
    **dict.fromkeys(("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "mistral", "granite", "olmo2", "starcoder2"),
                    "dense"),
    **dict.fromkeys(("gemma2", "gemma3", "gpt-oss"), "iswa"),
    "deepseek2": "mla",
    "falcon-h1": "ssm-hybrid",
    "qwen3next": "linear-hybrid",
}


@attrs.frozen
class Shipped:
    passed: bool
    checks: str  # "passed/total" as `python -m bench.gate check bench/results/gate-matrix` prints them


SHIPPED_SOURCE = "bench/results/gate-matrix at 7278a02"
# tests/test_cutover.py recomputes this table from the committed matrix: it cannot drift from it.
SHIPPED: dict[str, Shipped] = {
    "dense": Shipped(False, "11/22"),
    "iswa": Shipped(False, "14/22"),
    "mla": Shipped(False, "19/22"),
    "ssm-hybrid": Shipped(False, "12/22"),
    "linear-hybrid": Shipped(False, "18/22"),
}


class GateVerdictError(SkippyError):
    """A verdict file that cannot be read as one (truncated, edited, another program's)."""


@attrs.frozen
class Hardware:
    """What a verdict's numbers depend on: the CPU, its vector ISA, the cores, any GPU layers."""

    cpu: str
    isa: tuple[str, ...]
    cores: int
    gpu: str = "none"

    def key(self) -> str:
        return hashlib.sha256(json.dumps(attrs.asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def line(self) -> str:
        return f"{self.cpu} ({' '.join(self.isa) or 'no SIMD flags'}), {self.cores} cores, GPU {self.gpu}"


ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "amx_tile", "asimd", "sve", "i8mm")


def hardware_here(gpu_layers: int = 0) -> Hardware:
    """This machine, read from /proc/cpuinfo (the platform's name where there is none)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name in ("model name", "Model", "CPU part") and cpu in ("", platform.processor(), platform.machine()):
                cpu = value.strip()
            elif name in ("flags", "Features"):
                flags |= set(value.split())
    except OSError:
        pass
    gpu = "none"
    if gpu_layers:
        from .native._devices import offloads

        gpu = f"{gpu_layers} layers offloaded" if offloads(gpu_layers) else "none"
    return Hardware(cpu, tuple(f for f in ISA_FLAGS if f in flags), os.cpu_count() or 1, gpu)


@attrs.frozen
class GateVerdict:
    """What `skippy gate` found for one model file on one machine."""

    model_sha256: str
    model: str  # the file's name
    arch: str
    gate_class: str
    hardware: Hardware
    threads: int
    build: str  # skippy.check.build_id(): the native build (pin, patches, flags) the numbers came from
    passed: bool
    checks: tuple[str, ...]  # one line per check, as printed
    command: str
    date: str  # ISO 8601, UTC
    version: int = GATE_VERSION

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: Path | str = "verdict") -> "GateVerdict":
        try:
            d = json.loads(text)
            hw = d.pop("hardware")
            verdict = cls(**{**d, "checks": tuple(d["checks"])}, hardware=Hardware(**{**hw, "isa": tuple(hw["isa"])}))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise GateVerdictError(f"{where} is not a gate verdict ({type(exc).__name__}: {exc}); delete it or "
                                   "run `skippy gate` again") from None
        if not isinstance(verdict.passed, bool) or not isinstance(verdict.version, int):
            raise GateVerdictError(f"{where} is not a gate verdict (passed/version of the wrong type); delete it or "
                                   "run `skippy gate` again")
        return verdict


def verdict_dir() -> Path:
    return cache_root() / "gate"


def verdict_path(model_sha256: str, hardware: Hardware) -> Path:
    return verdict_dir() / f"{model_sha256[:16]}-{hardware.key()}.json"


def store_verdict(verdict: GateVerdict) -> Path:
    path = verdict_path(verdict.model_sha256, verdict.hardware)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(verdict.to_json())
    os.replace(tmp, path)
    return path


def load_verdict(model_sha256: str, hardware: Hardware, threads: int, build: str) -> GateVerdict | None:
    """This model's verdict on this machine, or None: none there, or only stale or foreign ones
    (each ignored with a log line). GateVerdictError for a file that is not a verdict at all."""
    path = verdict_path(model_sha256, hardware)
    # this machine's file first, then the model's verdicts from other machines (a cache copied or
    # shared between hosts): those are only worth a line saying why they do not count
    others = sorted(p for p in verdict_dir().glob(f"{model_sha256[:16]}-*.json") if p != path)
    for candidate in [path, *others]:
        try:
            text = candidate.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise GateVerdictError(f"cannot read the gate verdict {candidate}: {exc}") from None
        verdict = GateVerdict.from_json(text, candidate)
        why = stale_or_foreign(verdict, model_sha256, hardware, threads, build)
        if not why:
            return verdict
        logger.warning("ignoring the gate verdict {}: {}; run `skippy gate` here to judge this setup", candidate, why)
    return None


def stale_or_foreign(verdict: GateVerdict, model_sha256: str, hardware: Hardware, threads: int, build: str) -> str:
    """Why a verdict does not speak for this model, machine and setup ('' when it does)."""
    if verdict.model_sha256 != model_sha256:
        return f"it was reached for another model ({verdict.model}, sha256 {verdict.model_sha256[:12]})"
    if verdict.hardware != hardware:
        return f"it was reached on other hardware ({verdict.hardware.line()})"
    if verdict.version != GATE_VERSION:
        return f"it comes from gate version {verdict.version}, this is {GATE_VERSION}"
    if verdict.build != build:
        return f"it was reached on another native build ({verdict.build}; this one is {build})"
    if verdict.threads != threads:
        return f"it was measured with --threads {verdict.threads}, this server runs {threads}"
    return ""


@attrs.frozen
class Decision:
    scheduler: str  # "batched" or "single-lane"
    reason: str

    def line(self) -> str:
        return f"scheduler: {self.scheduler} ({self.reason})"


def decide(requested: str, arch: str, verdict: GateVerdict | None) -> Decision:
    """`--scheduler` resolved: an explicit choice stands; `auto` follows this machine's verdict,
    else the shipped table, else (an architecture no gate has run) single-lane."""
    if requested not in SCHEDULERS:
        raise SkippyError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {requested!r}")
    if requested != "auto":
        return Decision(requested, "asked for with --scheduler")
    if verdict is not None:
        state = "passed" if verdict.passed else "failed"
        return Decision("batched" if verdict.passed else "single-lane",
                        f"auto: `skippy gate` {state} for this model on this machine on {verdict.date[:10]}")
    gate_class = GATE_CLASSES.get(arch)
    if gate_class is None:
        return Decision("single-lane", f"auto: no gate has run for architecture {arch!r}; `skippy gate` judges it "
                                       "here, --scheduler batched overrides")
    shipped = SHIPPED[gate_class]
    state = "passed" if shipped.passed else "failed"
    return Decision("batched" if shipped.passed else "single-lane",
                    f"auto: the {gate_class} class {state} the gate ({shipped.checks} checks, {SHIPPED_SOURCE}); "
                    "`skippy gate` judges this model on this machine, --scheduler batched overrides")


def verdict_for(model: Path, threads: int, gpu_layers: int = 0) -> GateVerdict | None:
    from .check import build_id, file_sha256

    return load_verdict(file_sha256(model), hardware_here(gpu_layers), threads, build_id())


def resolve(requested: str, model: Path, arch: str, threads: int, gpu_layers: int = 0) -> Decision:
    """decide() with this machine's verdict for `model` read only when `auto` needs it."""
    verdict = verdict_for(model, threads, gpu_layers) if requested == "auto" else None
    return decide(requested, arch, verdict)


def verdict_summary(verdict: GateVerdict, path: Path) -> list[str]:
    return [*verdict.checks, f"{verdict.model} ({verdict.arch}, {verdict.gate_class}): "
            f"{'PASS' if verdict.passed else 'FAIL'} on {verdict.hardware.line()}; verdict {path}"]
