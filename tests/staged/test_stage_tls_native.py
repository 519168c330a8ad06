"""A pipeline over TLS links (with the stage secret too), on the real library: the same tokens as one
process, plaintext strangers refused at each TLS stage mid-run without disturbing the session, and a
stage 0 that does not trust the stages' CA (or talks plaintext) connects to nothing. `skippy pipeline`
with --tls-cert/--tls-key/--tls-ca serves HTTPS over TLS links.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from skippy.engine import open_engine
from skippy.errors import StageUnavailableError
from skippy.staged import PINNED_SPLITS, FrameError, Hello, StageDisconnected, connect
from skippy.staged._pipeline import open_pipeline
from skippy.staged._stage import StageRuntime, serve_stage
from skippy.staged._tls import client_tls, server_context

from _procs import stop_process
from ._certs import make_tls_files
from .test_pipeline_cli_native import _free_port, _processes_running
from .test_pipeline_native import GREEDY, N_BATCH, N_CTX, SAMPLED, _concurrently, _generate, _prompts

pytestmark = [pytest.mark.staged, pytest.mark.native]

SECRET = b"a shared stage secret, 32 bytes!"


async def _plaintext_stranger(port: int, runtime: StageRuntime, stage: int) -> object:
    """A plaintext peer saying the right Hello: what it gets back (never a Hello)."""
    link = await connect("127.0.0.1", port)
    await link.send(Hello(stage, stage + 1, 0, runtime.layers[0], runtime.model.n_layer, runtime.model.n_embd,
                          runtime.digest))
    try:
        return await link.receive()
    except (StageDisconnected, FrameError) as exc:
        return exc
    finally:
        await link.aclose()


async def test_a_pipeline_over_tls_is_bit_exact_and_refuses_plaintext_and_untrusting_peers(synth_model_path,
                                                                                           tmp_path):
    certs = make_tls_files(tmp_path)
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][3]
    prompts = _prompts(6, 260)
    tls = client_tls(certs.ca)
    with trio.fail_after(300):
        async with open_engine(path, n_ctx=N_CTX, n_batch=N_BATCH, threads=2, prefix_cache=False) as engine:
            solo = {kind: [await _generate(engine, p, s, 8) for p in prompts]
                    for kind, s in (("greedy", GREEDY), ("sampled", SAMPLED))}
        runtimes = [StageRuntime(path, layers, n_ctx=N_CTX, n_batch=N_BATCH, threads=1) for layers in splits[1:]]
        try:
            async with trio.open_nursery() as nursery:
                context = server_context(certs.cert, certs.key)
                last = await nursery.start(lambda task_status: serve_stage(
                    runtimes[1], "127.0.0.1", 0, None, secret=SECRET, tls=context, task_status=task_status))
                first = await nursery.start(lambda task_status: serve_stage(
                    runtimes[0], "127.0.0.1", 0, ("127.0.0.1", last), secret=SECRET, tls=context, next_tls=tls,
                    task_status=task_status))
                async with open_pipeline(path, splits[0][1], ("127.0.0.1", first), n_ctx=N_CTX, n_batch=N_BATCH,
                                         threads=1, secret=SECRET, tls=tls) as engine:
                    assert await _concurrently(engine, prompts, GREEDY, 8) == solo["greedy"]
                    assert isinstance(engine.runtime.link.session.stream.stream, trio.SSLStream)
                    epoch = engine.runtime.link.session.epoch
                    for port, runtime, stage in ((first, runtimes[0], 0), (last, runtimes[1], 1)):
                        answer = await _plaintext_stranger(port, runtime, stage)
                        assert not isinstance(answer, Hello), answer
                    # the session the strangers tried to reach serves on, on the same connection
                    assert await _concurrently(engine, prompts, SAMPLED, 8) == solo["sampled"]
                    assert engine.runtime.link.session.epoch == epoch
                # a stage 0 trusting another CA, and one talking plaintext, open nothing
                for link_tls, problem in ((client_tls(certs.other_ca), "certificate verify failed"),
                                          (None, "closed the connection at Hello|unreachable")):
                    with pytest.raises(StageUnavailableError, match=problem):
                        async with open_pipeline(path, splits[0][1], ("127.0.0.1", first), n_ctx=N_CTX,
                                                 n_batch=N_BATCH, threads=1, secret=SECRET, tls=link_tls):
                            pass
                nursery.cancel_scope.cancel()
        finally:
            for rt in runtimes:
                rt.close()


def test_skippy_pipeline_serves_https_over_tls_links(synth_model_path, tmp_path):
    openai = pytest.importorskip("openai", reason="the openai client is a dev extra")
    certs = make_tls_files(tmp_path)
    path = synth_model_path("llama", deep=True)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "skippy", "pipeline", "--model", str(path), "--stages", "3",
                             "--port", str(port), "--n-ctx", "512", "--n-batch", "64", "--threads", "1",
                             "--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--tls-ca", str(certs.ca)],
                            stderr=subprocess.PIPE, text=True)
    verify = ssl.create_default_context(cafile=str(certs.ca))
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=1, verify=verify).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        # the stages it started serve TLS and check their next against the CA
        stages = [Path(f"/proc/{pid}/cmdline").read_text() for pid in _processes_running(f"stage\0--model\0{path}")]
        tls_options = f"--tls-cert\0{certs.cert}\0--tls-key\0{certs.key}\0--tls-ca\0{certs.ca}"
        assert len(stages) == 2 and all(tls_options in argv for argv in stages)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60, max_retries=0,
                               http_client=httpx.Client(verify=verify, timeout=60))
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt=[300, 301, 302], max_tokens=5, temperature=0)
        assert done.usage.completion_tokens == 5 and done.choices[0].finish_reason in ("length", "stop")
    finally:
        stop_process(proc)
    assert proc.returncode == 0
