"""A burst of N streamed completions (128-ish prompt tokens, 64 out, ignore_eos) at once against a
server on 127.0.0.1:PORT; prints each TTFT / E2E / TPOT and the burst's output tok/s. Usage: N PORT."""
import sys, time, json, asyncio, httpx
N = int(sys.argv[1]); port = sys.argv[2]
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
async def one(c, i):
    prompt = " ".join(words[(i * 7 + j) % len(words)] + str(i) for j in range(60))
    t0 = time.perf_counter(); first = None; n = 0
    async with c.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json={"model": "gemma3", "prompt": prompt, "max_tokens": 64, "ignore_eos": True, "stream": True, "temperature": 0}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if first is None: first = time.perf_counter() - t0
                n += 1
    e2e = time.perf_counter() - t0
    return first, e2e, n
async def main():
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        res = await asyncio.gather(*[one(c, i) for i in range(N)])
        dur = time.perf_counter() - t0
    for f, e, n in sorted(res): print(f"ttft {f:.2f} e2e {e:.2f} tpot {(e-f)/max(1,n-1)*1000:.0f}")
    print("dur", round(dur, 2), "tok/s", round(sum(r[2] for r in res) / dur, 1))
asyncio.run(main())
