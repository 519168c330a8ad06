"""Fuzz the HTTP surface: hypothesis-generated requests against every route of a live server.

    python -m stress.fuzz_http --requests 10000 --seed 0 --out stress/results/fuzz-http.md

The server is the real app and hypercorn (with its limits) on loopback, over the real engine on
a FakeRuntime (skippy.testing), in this process. Requests: every route and some that are not,
any method; bodies are plausible requests whose fields take hostile values (wrong types, huge
or negative numbers, NaN, odd unicode, lone surrogates), arbitrary JSON, raw bytes (invalid
UTF-8, not JSON), mutated JSON, deep nesting; random content types and headers. Invariants:
every answer is 2xx or 4xx, a 4xx carries OpenAI's error body, a 2xx the route's shape (an SSE
stream ends with [DONE] and carries no error); nothing is logged at ERROR (no traceback); and
afterwards a correct request is answered correctly and the engine is idle. tests/server/
test_fuzz_http.py runs the same with a bounded number of examples. Exit 1 if an invariant fails.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import time
import traceback
from collections import Counter
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import attrs
import httpx
import trio
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from loguru import logger

from skippy.server import HttpLimits, create_app, serve_app
from skippy.testing import FakeRuntime, open_fake_engine

MODEL = "m"
N_VOCAB = 64
ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/tokenize": "POST",
          "/detokenize": "POST", "/health": "GET", "/metrics": "GET"}
LIMITS = HttpLimits(max_body_bytes=256 << 10)  # small, so the generated large bodies meet it too

# -- values -------------------------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\ud83d", "\udbff\u0041", "\ud800\ud800"])
ODD_TEXT = st.sampled_from(["", " ", "\x00", "\u202e\u2066", "\ufeff", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\r\n\r\n", "data: [DONE]\n\n",
                            "</s><|im_start|>system", "{{ raise }}", "%s%n%x", "\\u0000", "é" * 300, "🙂" * 64,
                            "null", "[]", "m", "M", "m ", "../../etc/passwd"])
TEXT = st.one_of(st.text(max_size=24), st.text(st.characters(min_codepoint=0x80), max_size=12), SURROGATES, ODD_TEXT)
INTS = st.one_of(st.integers(-3, 70), st.integers(),
                 st.sampled_from([2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -2**63 - 1,
                                  10**30, -10**30, 10**300]))
FLOATS = st.one_of(st.floats(), st.sampled_from([-0.0, 5e-324, 1e308, 0.5, 1.0, 2.0, 2.0000001]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
HOSTILE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                       max_leaves=12)


def field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A value the server should take (bodies get hostile values in `bodies`, one field or many)."""
    return valid


TOKEN_IDS = st.lists(st.integers(0, N_VOCAB - 1), min_size=1, max_size=24)
PROMPT = st.one_of(st.text(min_size=1, max_size=40), TOKEN_IDS, st.lists(st.text(min_size=1, max_size=8), min_size=1,
                   max_size=4), st.lists(TOKEN_IDS, min_size=1, max_size=4))
MESSAGE = st.fixed_dictionaries(
    {"role": field(st.sampled_from(["system", "developer", "user", "assistant", "tool"])),
     "content": field(st.one_of(st.text(max_size=40), st.lists(st.fixed_dictionaries(
         {"type": st.just("text"), "text": st.text(max_size=10)}), max_size=3)))},
    optional={"name": TEXT})
SAMPLING = {
    "max_tokens": field(st.integers(1, 8)), "n_predict": field(st.integers(-1, 8)),
    "temperature": field(st.floats(0, 2)), "top_p": field(st.floats(0.01, 1)), "top_k": field(st.integers(-1, 80)),
    "min_p": field(st.floats(0, 1)), "seed": field(st.integers(-1, 2**32)),
    "stop": field(st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=5))),
    "stream": field(st.booleans()), "stream_options": field(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "ignore_eos": field(st.booleans()), "priority": field(st.integers(-5, 5)),
    "presence_penalty": field(st.floats(-2, 2)), "frequency_penalty": field(st.floats(-2, 2)),
    "repetition_penalty": field(st.floats(0.5, 2)), "repeat_last_n": field(st.integers(-1, 64)),
    "logit_bias": field(st.dictionaries(st.integers(0, N_VOCAB - 1).map(str), st.floats(-100, 100), max_size=4)),
    "n": field(st.just(1)), "logprobs": field(st.sampled_from([False, 0])), "echo": field(st.just(False)),
    "user": TEXT, "cache_prompt": st.booleans(),
}
BODIES = {
    "/v1/completions": st.fixed_dictionaries({"model": field(st.just(MODEL)), "prompt": field(PROMPT)},
                                             optional=SAMPLING),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"model": field(st.just(MODEL)), "messages": field(st.lists(MESSAGE, min_size=1, max_size=3))},
        optional={**SAMPLING, "max_completion_tokens": field(st.integers(1, 8))}),
    "/tokenize": st.fixed_dictionaries({"content": field(st.text(max_size=40))},
                                       optional={"add_special": field(st.booleans()),
                                                 "with_pieces": field(st.booleans())}),
    "/detokenize": st.fixed_dictionaries({"tokens": field(TOKEN_IDS)}),
}


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN/Infinity as Python writes them; surrogates escaped


@st.composite
def bodies(draw: Any, path: str) -> bytes:
    kind = draw(st.sampled_from(["structured"] * 6 + ["json", "raw", "mutated", "nested", "number", "empty"]))
    if kind == "structured" and path in BODIES:
        value = draw(BODIES[path])
        known = sorted(set(value) | set(SAMPLING)) if path.startswith("/v1/") else sorted(value)
        known += [k for k in ("model", "prompt", "messages", "content", "tokens") if k in value] * 4  # the main ones
        # valid, or one known field hostile, or several (and a nested one: messages, stream_options)
        for name in draw(st.lists(st.sampled_from(known), max_size=draw(st.sampled_from([0, 1, 1, 3])))):
            value[name] = draw(HOSTILE)
        if "messages" in value and isinstance(value["messages"], list) and value["messages"] and draw(st.booleans()):
            message = value["messages"][0]
            if isinstance(message, dict):
                message[draw(st.sampled_from(["role", "content", "name", "tool_calls"]))] = draw(HOSTILE)
        value.update(draw(st.dictionaries(TEXT, HOSTILE, max_size=2)))  # unknown fields
        return _dumps(value)
    if kind in ("structured", "json"):
        return _dumps(draw(HOSTILE))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "mutated":
        raw = bytearray(_dumps(draw(BODIES.get(path, HOSTILE))))
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw[:draw(st.integers(0, len(raw)))]) if draw(st.booleans()) else bytes(raw)
    if kind == "nested":
        depth = draw(st.sampled_from([10, 900, 5000, 100_000, 300_000]))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        return opener * depth + (b"]" if opener == b"[" else b"}") * depth
    if kind == "number":
        digits = draw(st.sampled_from([20, 400, 4300, 5000, 50_000]))
        name = draw(st.sampled_from(["max_tokens", "seed", "temperature", "top_k", "priority", "n_predict"]))
        return b'{"model":"m","prompt":[1],"' + name.encode() + b'":' + b"9" * digits + b"}"
    return b""


HEADER_NAME = st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=20).filter(
    lambda n: n.lower() not in {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                                "http2-settings", "keep-alive"})
HEADER_VALUE = st.text(string.ascii_letters + string.digits + string.punctuation + " ", max_size=60).map(str.strip)
CONTENT_TYPES = st.one_of(st.sampled_from(["application/json", "application/json; charset=utf-16", "text/plain",
                                           "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                           "application/octet-stream", "*/*", ""]), HEADER_VALUE)


@attrs.frozen
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def short(self) -> str:
        return f"{self.method} {self.path} {self.headers} {self.body[:300]!r}{'...' if len(self.body) > 300 else ''}"


@st.composite
def http_requests(draw: Any) -> HttpRequest:
    path = draw(st.sampled_from(list(ROUTES)))
    method = ROUTES[path] if draw(st.integers(0, 9)) else draw(
        st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    if not draw(st.integers(0, 19)):
        path = "/" + draw(st.text(string.ascii_letters + string.digits + "/._-%~", max_size=20))
    if not draw(st.integers(0, 9)):
        path += "?" + draw(st.text(string.ascii_letters + string.digits + "=&%", max_size=20))
    headers = dict(draw(st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=3)))
    if draw(st.integers(0, 3)):
        headers["content-type"] = draw(CONTENT_TYPES)
    body = draw(bodies(path)) if method != "GET" or not draw(st.integers(0, 4)) else b""
    return HttpRequest(method, path, headers, body)


# -- one request, judged -----------------------------------------------------------------------


def _error_shape(body: bytes) -> str | None:
    try:
        data = json.loads(body)
        err = data["error"]
        ok = (set(data) == {"error"} and set(err) == {"message", "type", "param", "code"}
              and isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str))
    except (ValueError, KeyError, TypeError):
        ok = False
    return None if ok else f"an error without OpenAI's body: {body[:200]!r}"


def _success_shape(req: HttpRequest, r: httpx.Response) -> str | None:
    ctype = r.headers.get("content-type", "")
    if "text/event-stream" in ctype:
        events = [line[6:] for line in r.text.split("\r\n") if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"a stream that does not end with [DONE]: {r.text[-200:]!r}"
        for event in events[:-1]:
            chunk = json.loads(event)
            if "error" in chunk:
                return f"an error inside a 200 stream: {event[:200]}"
        return None
    if req.path.startswith("/metrics"):
        return None if "skippy_requests_running" in r.text else "metrics without skippy_requests_running"
    try:
        data = r.json()
    except ValueError:
        return f"a 2xx body that is not JSON: {r.content[:200]!r}"
    return None if isinstance(data, dict) else f"a 2xx body that is not an object: {r.content[:200]!r}"


def judge(req: HttpRequest, r: httpx.Response) -> str | None:
    """What is wrong with this answer to `req`, or None."""
    if not (200 <= r.status_code < 300 or 400 <= r.status_code < 500):
        return f"HTTP {r.status_code}: {r.content[:300]!r}"
    if req.method == "HEAD":
        return None
    if r.status_code >= 400:
        return _error_shape(r.content)
    return _success_shape(req, r)


def send(client: httpx.Client, req: HttpRequest) -> httpx.Response:
    return client.request(req.method, req.path, headers=req.headers, content=req.body)


# -- the server ------------------------------------------------------------------------------


@attrs.define
class Served:
    url: str
    runtime: FakeRuntime
    engine: Any
    errors: list[str]  # log records at ERROR and above, and any with a traceback


def _compact(record: Any) -> str:
    """A log record as its message and, if it has one, its exception's last frames."""
    text = f"{record['level'].name}: {record['message']}"
    exc = record["exception"]
    if exc is not None and exc.value is not None:
        frames = traceback.extract_tb(exc.traceback)[-4:]
        text += "\n" + "".join(traceback.format_list(frames)) + "".join(
            traceback.format_exception_only(exc.type, exc.value))
    return text


@asynccontextmanager
async def fuzz_server() -> AsyncIterator[Served]:
    """The app on a fake engine, served on loopback with LIMITS; log errors collected."""
    errors: list[str] = []

    def sink(message: Any) -> None:
        record = message.record
        if record["level"].no >= 40 or record["exception"] is not None:
            errors.append(_compact(record))

    logger.enable("skippy")
    handle = logger.add(sink, level="WARNING")
    try:
        rt = FakeRuntime(n_ctx=256, n_batch=32, n_seq_max=8, n_vocab=N_VOCAB)
        async with open_fake_engine(rt) as engine:
            app = create_app(engine, model_names=[MODEL])
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(partial(serve_app, app, "127.0.0.1", 0, limits=LIMITS))
                yield Served(binds[0], rt, engine, errors)
                nursery.cancel_scope.cancel()
    finally:
        logger.remove(handle)
        logger.disable("skippy")


def correct_request_works(client: httpx.Client, rt: FakeRuntime) -> str | None:
    """A well-formed request after the fuzzing gets the tokens it gets on a fresh engine."""
    prompt = [3, 1, 4, 1, 5]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                                             "ignore_eos": True})
    want = "".join(rt.piece(t).decode() for t in rt.solo(prompt, 4))
    if r.status_code != 200 or r.json()["choices"][0]["text"] != want:
        return f"a correct request afterwards got {r.status_code} {r.text[:300]}"
    return None


def fuzz(url: str, examples: int, *, on_problem: Callable[[HttpRequest, str], None], rng_seed: int | None = None,
         tally: Counter | None = None) -> None:
    """Send `examples` generated requests (in this thread); each problem goes to `on_problem`."""
    previous = ["-"]
    with httpx.Client(base_url=url, timeout=30) as client:
        @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(http_requests())
        def one(req: HttpRequest) -> None:
            try:
                r = send(client, req)
            except httpx.TransportError as exc:  # no answer at all
                # an over-limit body is answered 413 before it is read, and the connection closed: a
                # client that writes all of its body before reading may see the reset instead
                oversized = len(req.body) > LIMITS.max_body_bytes
                if tally is not None:
                    tally["reset (body over the limit)" if oversized else "no answer"] += 1
                if not oversized:
                    on_problem(req, f"no answer: {exc!r} (the request before on this client: {previous[0]})")
                return
            finally:
                previous[0] = req.short()[:200]
            if tally is not None:
                tally[r.status_code] += 1
            problem = judge(req, r)
            if problem is not None:
                on_problem(req, problem)

        (seed(rng_seed)(one) if rng_seed is not None else one)()


# -- the long run ------------------------------------------------------------------------------


async def run(requests: int, rng_seed: int) -> dict[str, Any]:
    problems: dict[str, list[str]] = {}
    tally: Counter = Counter()

    def record(req: HttpRequest, problem: str) -> None:
        problems.setdefault(problem.split(":")[0], []).append(f"{problem} <- {req.short()}")

    t0 = time.perf_counter()
    async with fuzz_server() as served:
        await trio.to_thread.run_sync(partial(fuzz, served.url, requests, on_problem=record, rng_seed=rng_seed,
                                              tally=tally))
        with httpx.Client(base_url=served.url, timeout=30) as client:
            after = await trio.to_thread.run_sync(correct_request_works, client, served.runtime)
        with trio.move_on_after(10):
            await served.engine.settled()
        stats = served.engine.stats()
        errors = list(served.errors)
    return {"requests": sum(tally.values()), "seconds": round(time.perf_counter() - t0, 1), "seed": rng_seed,
            "statuses": dict(sorted(tally.items(), key=str)), "problems": problems, "log_errors": errors,
            "correct_after": after, "idle_after": stats.running == 0 and stats.waiting == 0,
            "finished": dict(stats.finished)}


def report(result: dict[str, Any], command: str) -> str:
    ok = not result["problems"] and not result["log_errors"] and result["correct_after"] is None and result["idle_after"]
    lines = [
        "# HTTP surface fuzz", "",
        f"`{command}`", "",
        f"- requests: {result['requests']} in {result['seconds']} s (hypothesis seed {result['seed']})",
        f"- statuses: {', '.join(f'{k}: {v}' for k, v in result['statuses'].items())}",
        f"- 5xx or other non-2xx/4xx answers, 4xx without OpenAI's error body, bad 2xx shapes: "
        f"{sum(len(v) for v in result['problems'].values())}",
        f"- log records at ERROR or with a traceback: {len(result['log_errors'])}",
        f"- a correct request afterwards: {'answered correctly' if result['correct_after'] is None else result['correct_after']}",
        f"- engine idle afterwards: {result['idle_after']} (finished: {result['finished']})",
        "", f"**{'PASS' if ok else 'FAIL'}**", "",
    ]
    for kind, examples in result["problems"].items():
        lines += [f"## {kind} ({len(examples)})", ""] + [f"- `{e[:400]}`" for e in examples[:5]] + [""]
    for error in result["log_errors"][:5]:
        lines += ["```", error[:2000], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stress.fuzz_http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the summary (markdown) here")
    args = parser.parse_args(argv)
    result = trio.run(run, args.requests, args.seed)
    command = "python -m stress.fuzz_http " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(result, command)
    print(text)
    if args.out:
        args.out.write_text(text)
    ok = not result["problems"] and not result["log_errors"] and result["correct_after"] is None and result["idle_after"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
