"""The `skippy` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.native


def _skippy(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skippy", *args], capture_output=True, text=True, timeout=timeout
    )


def test_generate_on_the_default_model_is_repeatable(native_build, smollm2_path):
    runs = [_skippy("generate", "Once upon a time", "--max-tokens", "16") for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout.startswith("Once upon a time")
    assert len(runs[0].stdout.strip()) > len("Once upon a time")


def test_generate_on_a_synthetic_family(native_build):
    run = _skippy("generate", "Once upon a time", "--family", "qwen3next", "--max-tokens", "8")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Once upon a time")


def test_generate_on_a_missing_model_is_a_clean_error(native_build, tmp_path):
    run = _skippy("generate", "hi", "--model", str(tmp_path / "missing.gguf"))
    assert run.returncode == 2
    assert "model file not found" in run.stderr
    assert "Traceback" not in run.stderr


def test_generate_rejects_zero_max_tokens(native_build):
    run = _skippy("generate", "hi", "--family", "llama", "--max-tokens", "0")
    assert run.returncode == 2
    assert "max_tokens" in run.stderr


def test_synth_writes_a_model(tmp_path):
    out = tmp_path / "m.gguf"
    run = _skippy("models", "synth", "gemma2", "--seed", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:4] == b"GGUF"


def test_the_family_help_names_every_synthetic_family():
    from skippy.cli import SYNTH_FAMILIES
    from skippy.models.synth import FAMILIES

    assert SYNTH_FAMILIES.split(", ") == list(FAMILIES)


@pytest.mark.parametrize("family", ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next",
                                    "qwen2", "qwen3", "qwen3moe", "phi3", "mamba2", "granite", "olmo2",
                                    "starcoder2", "gpt-oss"])
def test_plan_prints_the_plan_the_engine_uses(native_build, family):
    import json

    import trio

    import skippy
    from skippy.families import kv_class
    from skippy.models import synthetic_model

    run = subprocess.run([sys.executable, "-m", "skippy", "plan", "--family", family, "--memory", "6M", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    assert plan["total_bytes"] <= 6 * 2**20 and plan["ceiling"] >= 1
    assert plan["n_seq_max"] == plan["ceiling"] + plan["reserved_seq_ids"] <= 256
    assert set(plan["bytes"]) == {c.name.lower() for c in kv_class(plan["arch"]).components}
    assert plan["kv_class"] == kv_class(plan["arch"]).value  # derived from the ledger; the table cross-checks

    async def engine_plan():
        async with skippy.open_engine(synthetic_model(family), memory_bytes=6 * 2**20, threads=1) as engine:
            assert engine.runtime.kv_class.value == plan["kv_class"]
            return engine.runtime.n_ctx, engine.lanes.ceiling, engine.runtime.ledger()

    n_ctx, ceiling, ledger = trio.run(engine_plan)
    assert (n_ctx, ceiling) == (plan["n_ctx"], plan["ceiling"])
    assert sum(c.bytes for c in ledger.components) == plan["total_bytes"]  # what llama.cpp really allocated


def test_plan_refuses_a_budget_that_holds_nothing(native_build):
    run = subprocess.run([sys.executable, "-m", "skippy", "plan", "--family", "llama", "--memory", "1K"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "does not hold" in run.stderr


def _args(*argv: str):
    from skippy.cli import _parser

    return _parser().parse_args(list(argv))


def test_serve_maps_the_latency_options_to_the_engine_config():
    from skippy.cli import _serve_config
    from skippy.engine import EngineConfig

    default = _serve_config(_args("serve", "--family", "llama"))
    assert default["batch_invariant"] is True and "tpot_slo_ms" not in default and "ttft_slo_ms" not in default
    EngineConfig(**default)  # every key is an EngineConfig field
    fast = _serve_config(_args("serve", "--family", "llama", "--no-batch-invariant", "--tpot-slo-ms", "25",
                               "--ttft-slo-ms", "900", "--shed-late"))
    assert fast["batch_invariant"] is False and fast["tpot_slo_ms"] == 25.0 and fast["ttft_slo_ms"] == 900.0
    cfg = EngineConfig(**fast)
    assert (cfg.tpot_slo_ms, cfg.ttft_slo_ms, cfg.shed_late) == (25.0, 900.0, True)
    assert _serve_config(_args("serve", "--batch-invariant"))["batch_invariant"] is True
    # the old flag folds into the TPOT target
    assert _serve_config(_args("serve", "--tpot-target-ms", "30"))["tpot_slo_ms"] == 30.0
    assert _serve_config(_args("serve", "--no-slo-scheduling"))["slo_scheduling"] is False


@pytest.mark.parametrize("flag", ["--tpot-slo-ms", "--ttft-slo-ms", "--tpot-target-ms"])
@pytest.mark.parametrize("bad", ["-5", "0", "fast", "nan", "inf"])
def test_a_latency_target_must_be_a_positive_number_of_ms(flag, bad, capsys):
    with pytest.raises(SystemExit):
        _args("serve", flag, bad)
    assert flag in capsys.readouterr().err


def test_demo_passes_the_latency_options_to_the_engine(monkeypatch):
    from skippy import cli
    from skippy import demo

    seen = {}
    monkeypatch.setattr(cli, "_resolve_checked", lambda args: "model.gguf")

    def fake_main(model, sessions, max_tokens, progress=True, shared_prefix_tokens=0, **config):
        seen.update(config)
        return {"failed": 0}

    monkeypatch.setattr(demo, "main", fake_main)
    args = _args("demo", "--family", "llama", "--no-batch-invariant", "--tpot-slo-ms", "40", "--ttft-slo-ms", "500")
    assert args.func(args) == 0
    assert seen["batch_invariant"] is False and seen["tpot_slo_ms"] == 40.0 and seen["ttft_slo_ms"] == 500.0
