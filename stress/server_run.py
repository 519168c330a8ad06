"""Stress `skippy serve` over HTTP: N clients per round against a subprocess on a free loopback port.

    python -m stress.server_run --sessions 256 --rounds 4 --seed 0 --family llama --out server-n256

Clients (httpx under trio) send completions and chat completions, streamed (SSE) or not, with
the `priority` field; some hang up mid-stream, abandon a request, hit their own timeout, or
send malformed requests (bad JSON, wrong types, unknown fields, a prompt too long ...), which
must get a 4xx with OpenAI's JSON error body. After each round the server is drained and
/metrics must show it idle; the server's RSS is compared across rounds; sampled greedy
completions must equal their solo run; the server must stop cleanly on SIGINT. Exit 1 if an
invariant fails.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import attrs
import httpx
import numpy as np
import trio
from tqdm import tqdm

from . import invariants as inv
from . import report, tally
from .cli import RunConfig, as_dict, config_from, parser, vocab_range
from .outcomes import (
    CLIENT_CANCELLED,
    COMPLETED,
    ENDED_CANCELLED,
    FAILED,
    HUNG,
    OVERLOADED,
    REJECTED,
    TIMED_OUT,
    UNEXPECTED,
    Outcome,
)
from .reference import SoloReference
from .server_proc import finished_by_reason, log_findings, metrics, running_server, serve_argv
from .workload import Job, demand, make_round, pool_cells, server_malformed, shared_prefixes

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")


def request_body(job: Job, model: str) -> tuple[str, dict[str, Any], bool]:
    """(path, JSON body, streamed) of a well-formed job. Completions send token ids (so greedy
    ones can be compared with the solo run); chat sends text through the model's template."""
    stream = job.stream if job.kind in ("complete", "timeout") else job.kind == "disconnect"
    body: dict[str, Any] = {"model": model, "max_tokens": job.max_tokens, "priority": job.priority,
                            "temperature": 0.0}
    if not job.greedy:
        body.update(temperature=0.8, top_k=40, top_p=0.95, seed=job.seed)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if job.chat:
        words = " ".join(_WORDS[t % len(_WORDS)] for t in job.prompt[:12])
        body["messages"] = [{"role": "user", "content": f"{job.id}: {words}"}]
        return "/v1/chat/completions", body, stream
    body["prompt"] = list(job.prompt)
    return "/v1/completions", body, stream


def _error_body_ok(raw: bytes) -> bool:
    try:
        err = json.loads(raw)["error"]
        return isinstance(err["message"], str) and bool(err["message"]) and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError):
        return False


def _refused(o: Outcome, resp: httpx.Response, raw: bytes, job: Job) -> None:
    """A non-200 answer: what it means for this job."""
    o.http_status = resp.status_code
    o.error_body_ok = _error_body_ok(raw)
    o.detail = raw[:200].decode(errors="replace")
    if resp.status_code == 429:
        o.status = OVERLOADED if "retry-after" in resp.headers else UNEXPECTED
    elif resp.status_code == 503:
        o.status = ENDED_CANCELLED
    elif resp.status_code >= 500:
        o.status = FAILED
    elif job.kind == "malformed" and 400 <= resp.status_code < 500:
        o.status = REJECTED
    else:
        o.status = UNEXPECTED


def _chunk(o: Outcome, data: dict[str, Any], t_start: float) -> None:
    """One SSE data object: content, finish, usage, or an error."""
    if "error" in data:
        err = data["error"] if isinstance(data["error"], dict) else {}
        o.status = ENDED_CANCELLED if err.get("code") == "shutting_down" else FAILED
        o.detail = f"error chunk: {err.get('message', data['error'])}"
        return
    if data.get("id") and data["id"] not in o.response_ids:
        o.response_ids.append(data["id"])
    for c in data.get("choices") or []:
        text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
        if text:
            if o.finals:
                o.final_last = False
            o.chunks += 1
            o.text += text
            if o.ttft_s is None:
                o.ttft_s = time.perf_counter() - t_start
        if c.get("finish_reason"):
            o.finals += 1
            o.finish_reason = c["finish_reason"]
    if data.get("usage"):
        o.completion_tokens = data["usage"].get("completion_tokens")


async def _read_stream(resp: httpx.Response, job: Job, o: Outcome, t_start: float) -> None:
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if o.done:
            o.after_done += 1
            continue
        if payload == "[DONE]":
            o.done += 1
            continue
        try:
            _chunk(o, json.loads(payload), t_start)
        except ValueError:
            o.status, o.detail = UNEXPECTED, f"unparseable chunk {payload[:80]!r}"
            return
        if o.status in (FAILED, ENDED_CANCELLED):
            continue  # read to [DONE]: the stream must still end properly
        if job.kind == "disconnect" and o.chunks >= job.cut_after and not o.finals:
            o.status = CLIENT_CANCELLED  # hang up: leaving the `async with` closes the connection
            return
    if o.status in (FAILED, ENDED_CANCELLED):
        return
    if o.finals == 1 and o.done == 1:
        o.status = COMPLETED
    else:
        o.status, o.detail = UNEXPECTED, f"stream ended after {o.finals} finish chunks and {o.done} [DONE]"


def _read_full(raw: bytes, o: Outcome, t_start: float) -> None:
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        o.response_ids.append(data["id"])
        o.text = choice["text"] if "text" in choice else choice["message"]["content"]
        o.finish_reason = choice["finish_reason"]
        o.completion_tokens = data["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        o.status, o.detail = UNEXPECTED, f"unreadable response ({exc!r}): {raw[:120]!r}"
        return
    o.ttft_s = time.perf_counter() - t_start
    o.finals = 1 if o.finish_reason in ("stop", "length") else 0
    o.status = COMPLETED if o.finals else UNEXPECTED


async def _send(client: httpx.AsyncClient, url: str, job: Job, o: Outcome, model: str, n_ctx: int,
                n_vocab: int) -> None:
    t_start = time.perf_counter()
    if job.kind == "malformed":
        path, raw_body, o.expected_status = server_malformed(job, model, n_ctx, n_vocab)
        resp = await client.post(url + path, content=raw_body, headers={"content-type": "application/json"})
        if resp.status_code == 200:
            o.http_status, o.status, o.detail = 200, UNEXPECTED, f"malformed request ({job.malformed}) was accepted"
        else:
            _refused(o, resp, resp.content, job)
        return
    path, body, stream = request_body(job, model)
    timeout = httpx.Timeout(job.timeout_s) if job.kind == "timeout" else None
    kwargs = {"timeout": timeout} if timeout is not None else {}
    async with client.stream("POST", url + path, json=body, **kwargs) as resp:
        o.http_status = resp.status_code
        if resp.status_code != 200:
            _refused(o, resp, await resp.aread(), job)
            return
        if job.kind == "disconnect" and job.cut_after == 0:
            o.status = CLIENT_CANCELLED  # hang up as soon as the response starts
            return
        if stream:
            await _read_stream(resp, job, o, t_start)
        else:
            _read_full(await resp.aread(), o, t_start)


async def _job(client: httpx.AsyncClient, url: str, job: Job, outcomes: list[Outcome], bar: Any, t0: float,
               model: str, n_ctx: int, n_vocab: int) -> None:
    o = Outcome(job.id, job.kind, max_tokens=job.max_tokens, priority=job.priority, greedy=job.greedy)
    try:
        await trio.sleep_until(t0 + job.arrival_s)
        if job.kind == "cancel":  # the client abandons its request after a while (closing the connection)
            with trio.move_on_after(job.timeout_s) as scope:
                await _send(client, url, job, o, model, n_ctx, n_vocab)
            if scope.cancelled_caught:
                o.status = CLIENT_CANCELLED
        else:
            await _send(client, url, job, o, model, n_ctx, n_vocab)
    except trio.Cancelled:
        o.status, o.detail = HUNG, "still open at the round deadline"
        outcomes.append(o)
        raise
    except httpx.TimeoutException as exc:
        if job.kind == "timeout":
            o.status, o.detail = TIMED_OUT, type(exc).__name__
        else:
            o.status, o.detail = UNEXPECTED, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a transport error (the server dropped a connection) is a finding
        o.status, o.detail = UNEXPECTED, f"{type(exc).__name__}: {exc}"
    outcomes.append(o)
    if bar is not None:
        bar.update(1)


@attrs.frozen
class _Idle:
    snapshot: inv.MemorySnapshot
    finished: dict[str, int]


async def _drain(client: httpx.AsyncClient, url: str, timeout: float) -> _Idle:
    """Poll /metrics until nothing runs or waits and the attention cells in use are the prefix
    cache's; the snapshot at the timeout shows what stuck."""

    def snap(m: dict[str, float]) -> inv.MemorySnapshot:
        return inv.MemorySnapshot(
            running=int(m.get("skippy_requests_running", -1)), waiting=int(m.get("skippy_requests_waiting", -1)),
            attn_used=int(m.get('skippy_kv_used_cells{component="attn"}', 0)),
            prefix_resident=int(m.get("skippy_prefix_cache_resident_tokens", 0)))

    m = await metrics(client, url)
    with trio.move_on_after(timeout):
        while not inv.memory_idle(snap(m)).ok:
            await trio.sleep(0.02)
            m = await metrics(client, url)
    return _Idle(snap(m), finished_by_reason(m))


async def run(cfg: RunConfig, *, progress: bool | None = None, log_dir: Path | None = None) -> dict[str, Any]:
    """One stress run against a `skippy serve` subprocess; returns the summary (also written
    under stress/results/ when cfg.out)."""
    from skippy.native import ensure_built

    ensure_built(progress=False)
    path = cfg.model_path()
    solo_ctx = int(np.ceil((cfg.prompt[1] + 32 + cfg.max_tokens[1]) / 64) * 64)
    started = time.perf_counter()
    checks: list[inv.Check] = []
    rows: list[dict[str, Any]] = []
    rss: list[float] = []
    all_samples: list[inv.ParitySample] = []
    log = Path(log_dir or tempfile.mkdtemp(prefix="skippy-stress-")) / "server.log"
    with SoloReference(path, solo_ctx, cfg.threads) as ref:
        shape = cfg.shape(vocab_range(cfg, ref.n_vocab), server=True)
        prefixes = shared_prefixes(shape, cfg.seed)
        rounds = [make_round(shape, cfg.sessions, cfg.seed, r, prefixes) for r in range(cfg.rounds)]
        argv = serve_argv(cfg.model, cfg.family, n_ctx=pool_cells(rounds, cfg.demand_ratio), n_batch=cfg.n_batch,
                          n_seq_max=cfg.n_seq_max, threads=cfg.threads, max_waiting=cfg.waiting_bound)
        limits = httpx.Limits(max_connections=cfg.sessions + 16, max_keepalive_connections=cfg.sessions + 16)
        # Each round's clients connect anew, like new sessions: a keep-alive connection left idle over
        # the pause between rounds can race the server closing it, and a POST on it then fails
        # "disconnected without a response" (seen at N=256 while the server's keep-alive was 5 s).
        # /metrics reads use a client of their own.
        async with running_server(argv, log) as server, httpx.AsyncClient(timeout=30) as client:
            m0 = await metrics(client, server.url)
            fds_before = server.open_fds()
            pool = int(m0['skippy_kv_used_cells{component="attn"}'] + m0['skippy_kv_free_cells{component="attn"}'])
            for r, jobs in enumerate(rounds):
                before = finished_by_reason(await metrics(client, server.url))
                show = (not cfg.quiet) if progress is None else progress
                bar = tqdm(total=len(jobs), desc=f"server round {r + 1}/{cfg.rounds}", file=sys.stderr,
                           leave=False) if show else None
                outcomes: list[Outcome] = []
                t0 = trio.current_time()
                async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(cfg.round_timeout)) as clients:
                    with trio.move_on_after(cfg.round_timeout):
                        async with trio.open_nursery() as nursery:
                            for job in jobs:
                                nursery.start_soon(_job, clients, server.url, job, outcomes, bar, t0,
                                                   server.model_id, pool, ref.n_vocab)
                seconds = trio.current_time() - t0
                if bar is not None:
                    bar.close()
                idle = await _drain(client, server.url, cfg.drain_timeout)
                fds_after = await server.fds_settled(fds_before + 8)
                rss.append(server.rss_mib())
                finished = {k: v - before.get(k, 0) for k, v in idle.finished.items()}
                by_id = {j.id: j for j in jobs}
                eligible = {j.id for j in jobs if not j.chat}
                samples = []
                for o in tally.greedy_sample(outcomes, cfg.parity_sample, np.random.default_rng([cfg.seed, r, 7]),
                                             eligible):
                    want = ref.tokens(by_id[o.job_id].prompt, o.max_tokens)
                    samples.append(inv.ParitySample(o.job_id, (o.text, o.completion_tokens),
                                                    (ref.text(want), len(want))))
                all_samples += samples
                cut = sum(1 for o in outcomes if o.status in (CLIENT_CANCELLED, TIMED_OUT))
                completed = sum(1 for o in outcomes if o.status == COMPLETED)
                well_formed = sum(1 for j in jobs if j.kind != "malformed") - sum(
                    1 for o in outcomes if o.status == OVERLOADED)
                checks += tally.per_round(r + 1, [
                    inv.one_outcome_per_request(jobs, outcomes),
                    inv.no_decode_failure(outcomes),
                    inv.clear_outcomes(jobs, outcomes),
                    inv.server_responses_well_formed(outcomes),
                    inv.server_accounting(completed, cut, well_formed, finished),
                    inv.memory_idle(idle.snapshot),
                    inv.connections_released(fds_before, fds_after),
                    inv.solo_parity(samples),
                ])
                rows.append({
                    "round": r + 1, "seconds": seconds, "rss_mib": rss[-1], "outcomes": tally.statuses(outcomes),
                    "demand_cells": demand(jobs), "pool_cells": pool, "finished": finished,
                    "http_statuses": dict(sorted(_statuses(outcomes).items())),
                    "ttft_by_priority_s": tally.ttft_by_priority(outcomes),
                    "memory": attrs.asdict(idle.snapshot), "server_open_fds": fds_after,
                    "failures": [o.summary() for o in tally.not_fine(outcomes, jobs)],
                })
                if not cfg.quiet:
                    print(f"round {r + 1}: {seconds:.1f}s {tally.statuses(outcomes)} rss={rss[-1]:.1f}MiB",
                          file=sys.stderr, flush=True)
            m_end = await metrics(client, server.url)
            rc = await server.stop()
        findings = log_findings(server.log_text())
    mean_demand = sum(demand(j) for j in rounds) / len(rounds)
    final_checks = tally.roll_up(checks) + [
        inv.rss_stable(rss, cfg.rss_tolerance_mib, cfg.rss_tolerance_pct),
        inv.solo_parity(all_samples),
        inv.Check("server logged no error", not findings,
                  f"{len(findings)} findings" + (f": {sorted(set(findings))[:5]}" if findings else "")),
        inv.Check("server stopped cleanly on SIGINT", rc == 0, f"exit status {rc}"),
    ]
    totals = {
        "requests": cfg.sessions * cfg.rounds, "seconds": round(time.perf_counter() - started, 1),
        "pool_cells": pool, "mean_demand_cells": round(mean_demand), "demand_over_pool": round(mean_demand / pool, 2),
        "steps": int(m_end.get("skippy_engine_steps_total", 0)),
        "preemptions": int(m_end.get("skippy_preemptions_total", 0)),
        "output_tokens": int(m_end.get("skippy_generation_tokens_total", 0)),
        "prefix_hits_tokens": int(m_end.get("skippy_prefix_cache_hits_tokens_total", 0)),
        "finished": finished_by_reason(m_end), "rss_mib": [round(x, 1) for x in rss],
        "parity_compared": len(all_samples), "server_exit": rc, "server_argv": " ".join(argv[1:]),
        "server_log_findings": findings, "server_log": str(log),
    }
    result = report.summary("server", cfg.command or "stress.server_run", {**as_dict(cfg), "model_path": str(path)},
                            final_checks + checks, rows, totals)
    if cfg.out:
        result["written_to"] = str(report.write(result, cfg.out))
    return result


def _statuses(outcomes: Sequence[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        key = str(o.http_status) if o.http_status is not None else "none"
        out[key] = out.get(key, 0) + 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("stress.server_run", __doc__.splitlines()[0]).parse_args(argv)
    return report.finish(trio.run(run, config_from(args, argv, "stress.server_run")))


if __name__ == "__main__":
    sys.exit(main())
