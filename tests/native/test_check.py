"""The batch-invariance self-check (skippy.check): identical on every family we ship, NOT identical
(with the sequence and position) when the kernels are not batch-invariant, and its verdict reaches
the engine, /metrics and `skippy serve --require-invariant`."""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import numpy as np
import pytest
import trio

import skippy
from skippy import check
from skippy._lockstep import Result
from skippy.models.synth import FAMILIES
from skippy.server.metrics import ServerMetrics

pytestmark = pytest.mark.native

ONE_THREAD = {"threads": 1}  # two cores: one thread each keeps llama.cpp's spinning workers off each other


@pytest.fixture
def check_cache(private_cache):
    return private_cache / "checks"


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_on_every_synthetic_family(synth_model_path, check_cache, family):
    result = check.check_file(synth_model_path(family), ONE_THREAD)
    assert result.identical, "\n".join(result.lines())
    assert [v.scenario for v in result.verdicts] == ["one batch", "staggered + seq_cp prefix"]
    assert all(v.tokens == 8 * 32 for v in result.verdicts)


def test_identical_on_smollm2(smollm2_path, check_cache):
    result = check.check_file(smollm2_path, ONE_THREAD)
    assert result.identical, "\n".join(result.lines())
    assert result.arch == "llama"


@pytest.mark.parametrize("family", ["llama", "falcon-h1", "mamba2"])  # attention, hybrid, recurrent only
def test_catches_kernels_that_are_not_batch_invariant(synth_model_path, check_cache, family):
    """The default kernels (repacked weights, tiled attention) change a sequence's logits with
    its batch-mates: the same workload must come out NOT identical, naming where."""
    result = check.check_file(synth_model_path(family), {**ONE_THREAD, "batch_invariant": False})
    assert not result.identical
    for verdict in result.verdicts:
        assert not verdict.identical
        first = verdict.first
        assert first is not None and 0 <= first.sequence < verdict.sequences
        assert 0 <= first.token_index < 32 and first.position >= 4 - 1 + first.token_index
        assert verdict.line().startswith("NOT identical") and f"sequence {first.sequence}" in verdict.line()
    assert "NOT identical to solo runs" in result.lines()[-1]


def test_the_first_difference_is_the_first_row_that_differs():
    rows = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
    want = Result([1, 2, 3, 4, 5], rows)
    bent = rows.copy()
    bent[3, 2] = np.nextafter(bent[3, 2], np.inf)  # one ulp in the fourth row
    got = Result([1, 2, 3, 4, 5], bent)
    same = Result([1, 2, 3, 4, 5], rows.copy())
    prompts = [np.zeros(n, np.int32) for n in (7, 10)]
    verdict = check._compare("s", prompts, [same, got], [want, want])
    assert verdict.differing == 1
    assert verdict.first == check.Difference(sequence=1, token_index=3, position=10 - 1 + 3, tokens_differ=False)
    assert check._compare("s", prompts, [same, same], [want, want]).identical


def test_a_verdict_is_cached_per_model_build_and_options(synth_model_path, check_cache):
    with skippy.native.Model(synth_model_path("qwen3"), repack=False) as model:
        assert check.cached(model, ONE_THREAD) is None
        result = check.cached_or_run(model, ONE_THREAD)
        again = check.cached(model, ONE_THREAD)
        assert again is not None and again.cached and not result.cached
        assert again.verdicts == result.verdicts and again.key == result.key
        assert check.cached(model, {"threads": 2}) is None  # threads are part of the verdict
        assert check.cached(model, {**ONE_THREAD, "batch_invariant": False}) is None
    with skippy.native.Model(synth_model_path("qwen3", seed=1), repack=False) as other:
        assert check.cached(other, ONE_THREAD) is None  # another file, another sha256
    assert (check_cache / f"{result.key}.json").exists()


async def _open(path, **config):
    async with skippy.open_engine(path, n_ctx=512, n_batch=64, threads=1, **config) as engine:
        return engine.invariance, ServerMetrics(engine).render().decode()


async def test_the_engine_reports_the_verdict_on_metrics(synth_model_path, check_cache):
    path = synth_model_path("gemma2")
    with trio.fail_after(60):
        unverified, text = await _open(path)  # "cached" with nothing cached: not run, unknown
        assert unverified is None and 'skippy_batch_invariant{verified="unknown"} 1.0' in text
        ran, text = await _open(path, verify_invariance="run")
        assert ran.identical and not ran.cached and 'skippy_batch_invariant{verified="true"} 1.0' in text
        read, text = await _open(path)
        assert read.cached and read.key == ran.key and 'verified="true"' in text
        off, text = await _open(path, verify_invariance="off")
        assert off is None and 'verified="unknown"' in text
        _, text = await _open(path, batch_invariant=False)
        assert 'skippy_batch_invariant{verified="unknown"} 0.0' in text


async def test_an_engine_whose_context_is_not_invariant_fails_its_check(synth_model_path, check_cache):
    """An engine that claims invariance over a context opened without it: "run" reports false,
    "require" refuses to open."""
    path = synth_model_path("llama")
    broken = {"context_options": {"batch_invariant": False}}
    with trio.fail_after(60):
        failed, text = await _open(path, verify_invariance="run", **broken)
        assert not failed.identical and 'skippy_batch_invariant{verified="false"} 1.0' in text
        with pytest.raises(check.InvarianceError, match="not batch-invariant"):
            await _open(path, verify_invariance="require", **broken)
        with pytest.raises(skippy.errors.InvalidInputError, match="verify_invariance"):
            await _open(path, verify_invariance="sometimes")


def _skippy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skippy", *args], capture_output=True, text=True, timeout=120,
                          env=os.environ, check=False)


def test_the_check_command_and_serve_require_invariant(synth_model_path, check_cache):
    ok = _skippy("check", "--family", "phi3", "--threads", "1")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("identical") and "identical to solo runs" in lines[-1]
    # serve reads the verdict `skippy check` stored (same key: model, build, threads); make it a failing one
    (stored,) = [p for p in check_cache.glob("*.json") if p.name != "digests.json"]
    good = check.CheckResult.from_json(stored.read_text())
    bad = check.Verdict("staggered + seq_cp prefix", 8, 256, 2, check.Difference(3, 5, 17, True))
    stored.write_text(attrs.evolve(good, verdicts=(good.verdicts[0], bad)).to_json())
    refused = _skippy("serve", "--family", "phi3", "--threads", "1", "--port", "0", "--require-invariant")
    assert refused.returncode == 2
    err = [line for line in refused.stderr.splitlines() if line.strip()]
    want = f"skippy: error: {synth_model_path('phi3').name} is not batch-invariant on this build: {bad.line()}"
    assert err == [want], refused.stderr
    no_kernels = _skippy("serve", "--family", "phi3", "--port", "0", "--require-invariant", "--no-batch-invariant")
    assert no_kernels.returncode == 2 and "needs batch-invariant kernels" in no_kernels.stderr


def test_the_check_command_exits_1_when_not_identical(synth_model_path, check_cache, monkeypatch, capsys):
    """Exit 1 and the NOT identical lines through the command's own code, with the kernels
    switched off the way the library allows (batch_invariant=False in the options)."""
    from skippy import cli

    real = check.check_file
    monkeypatch.setattr(check, "check_file",
                        lambda path, options, **kw: real(path, {**options, "batch_invariant": False}, **kw))
    assert cli._check(cli._parser().parse_args(["check", "--family", "llama", "--threads", "1"])) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith("NOT identical") for line in lines[:2])
    assert "NOT identical to solo runs" in lines[-1]
