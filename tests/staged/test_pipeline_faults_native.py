"""Stages as separate `skippy stage` processes: one killed mid-run fails the requests in flight
with a clear error and no hang, and the pipeline serves again once it is back; the same
pipeline across network namespaces, as separate hosts on private addresses."""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid

import numpy as np
import pytest
import trio

from skippy.errors import StageUnavailableError, StepFailedError
from skippy.staged import PINNED_SPLITS
from skippy.staged._launch import StageProcess, stage_argv
from skippy.staged._pipeline import open_pipeline

pytestmark = [pytest.mark.staged, pytest.mark.native]

OPTIONS = ["--n-ctx", "1024", "--n-batch", "64", "--threads", "1"]
CONFIG = dict(n_ctx=1024, n_batch=64, threads=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(9)
    return [rng.integers(260, 460, size=int(rng.integers(4, 30))).tolist() for _ in range(n)]


async def _tokens(engine, prompts, max_tokens):
    out = [None] * len(prompts)

    async def one(i):
        got = []
        async for event in engine.generate(prompts[i], max_tokens=max_tokens, ignore_eos=True):
            if event.token is not None:
                got.append(event.token)
            if event.final:
                assert event.finish_reason == "length", event
        out[i] = got

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return out


@pytest.mark.parametrize("killed", [1, 2], ids=["middle-stage", "last-stage"])
async def test_a_killed_stage_fails_requests_in_flight_and_the_pipeline_recovers(killed, synth_model_path):
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][3]
    ports = {1: _free_port(), 2: _free_port()}
    argv = {2: stage_argv(path, splits[2], f"127.0.0.1:{ports[2]}", None, OPTIONS),
            1: stage_argv(path, splits[1], f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}", OPTIONS)}
    procs = {2: StageProcess(argv[2]), 1: StageProcess(argv[1])}
    try:
        with trio.fail_after(180):
            async with open_pipeline(path, splits[0][1], ("127.0.0.1", ports[1]), **CONFIG) as engine:
                before = await _tokens(engine, _prompts(3), 6)

                ends = []
                started = trio.Event()
                counts = [0] * 4

                async def long_one(i):
                    async for event in engine.generate(_prompts(4)[i], max_tokens=900, ignore_eos=True):
                        counts[i] += event.token is not None
                        if all(c >= 3 for c in counts):
                            started.set()
                        if event.final:
                            ends.append(event)

                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(long_one, i)
                    await started.wait()
                    procs[killed].kill()
                # every request in flight ended, with an error that names the lost stage
                assert len(ends) == 4
                for event in ends:
                    assert event.finish_reason == "error"
                    assert isinstance(event.error, StepFailedError)
                    assert isinstance(event.error.__cause__, StageUnavailableError), event.error
                    assert "gone" in str(event.error.__cause__) or "unreachable" in str(event.error.__cause__)

                # while it is down a new request fails fast, clearly
                with trio.fail_after(30):
                    async for event in engine.generate(_prompts(1)[0], max_tokens=4):
                        if event.final:
                            assert event.finish_reason == "error"
                            assert "unreachable" in str(event.error.__cause__) or "gone" in str(event.error.__cause__)

                procs[killed] = StageProcess(argv[killed])  # back on the same port
                after = await _tokens(engine, _prompts(3), 6)
                assert after == before
                finished = engine.stats().finished
                assert (finished["length"], finished["error"]) == (6, 5)
    finally:
        for proc in procs.values():
            proc.kill()


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _netns_usable() -> str | None:
    if shutil.which("ip") is None:
        return "no ip(8) on this machine"
    name = f"skp-probe-{uuid.uuid4().hex[:6]}"
    try:
        _sh("ip", "netns", "add", name)
        _sh("ip", "netns", "del", name)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot make network namespaces here (needs root and ip netns): {exc}"
    return None


@pytest.fixture
def two_hosts():
    """Two namespaces, each a 'host': root <-veth-> A <-veth-> B on private /30 addresses."""
    why = _netns_usable()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:5]
    a, b = f"skpA{tag}", f"skpB{tag}"
    try:
        _sh("ip", "netns", "add", a)
        _sh("ip", "netns", "add", b)
        _sh("ip", "link", "add", f"r{tag}", "type", "veth", "peer", "name", f"a{tag}")
        _sh("ip", "link", "set", f"a{tag}", "netns", a)
        _sh("ip", "link", "add", f"x{tag}", "type", "veth", "peer", "name", f"b{tag}")
        _sh("ip", "link", "set", f"x{tag}", "netns", a)
        _sh("ip", "link", "set", f"b{tag}", "netns", b)
        _sh("ip", "addr", "add", "10.213.1.1/30", "dev", f"r{tag}")
        _sh("ip", "link", "set", f"r{tag}", "up")
        _sh("ip", "-n", a, "addr", "add", "10.213.1.2/30", "dev", f"a{tag}")
        _sh("ip", "-n", a, "addr", "add", "10.213.2.1/30", "dev", f"x{tag}")
        _sh("ip", "-n", b, "addr", "add", "10.213.2.2/30", "dev", f"b{tag}")
        for ns, dev in ((a, f"a{tag}"), (a, f"x{tag}"), (a, "lo"), (b, f"b{tag}"), (b, "lo")):
            _sh("ip", "-n", ns, "link", "set", dev, "up")
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", f"r{tag}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)


async def test_stages_as_separate_hosts_in_network_namespaces(two_hosts, synth_model_path):
    host_a, host_b = two_hosts
    path = synth_model_path("qwen3next", deep=True)
    splits = PINNED_SPLITS["qwen3next"][3]
    # stages on network addresses need the stage secret (skippy stage refuses to listen there without one)
    secret = {"SKIPPY_STAGE_SECRET": "a secret shared by the three hosts"}
    last = StageProcess(stage_argv(path, splits[2], "10.213.2.2:7702", None, OPTIONS), netns=host_b, env=secret)
    middle = StageProcess(stage_argv(path, splits[1], "10.213.1.2:7701", "10.213.2.2:7702", OPTIONS), netns=host_a,
                          env=secret)
    try:
        with trio.fail_after(180):
            from skippy.engine import open_engine

            prompts = _prompts(4)
            async with open_engine(path, prefix_cache=False, **CONFIG) as engine:
                solo = [(await _tokens(engine, [p], 5))[0] for p in prompts]
            async with open_pipeline(path, splits[0][1], ("10.213.1.2", 7701),
                                     secret=secret["SKIPPY_STAGE_SECRET"].encode(), **CONFIG) as engine:
                assert engine.pipeline.n_stages == 3
                assert await _tokens(engine, prompts, 5) == solo
    finally:
        middle.kill()
        last.kill()
