"""Served TTFT of six 1024-token prompts in a row: python served_ttft.py --no-batch-invariant [--no-prefix-cache]"""
import subprocess, sys, time, json, os, signal
import numpy as np, httpx
from skippy._cache import cache_root
M = str(cache_root() / 'models' / 'SmolLM2-135M-Instruct.Q4_1.F16.gguf')  # made by: python -m bench.gate peers weights
extra = sys.argv[1:]
port = 47311
p = subprocess.Popen([sys.executable, '-m', 'skippy', 'serve', '--model', M, '--host', '127.0.0.1', '--port', str(port), '--threads', '2',
                      '--n-ctx', '40960', '--n-batch', '512', '--scheduler', 'batched', *extra], stdout=subprocess.DEVNULL, stderr=open('/tmp/gp/served.log', 'w'), start_new_session=True)
url = f'http://127.0.0.1:{port}'
try:
    for _ in range(600):
        try:
            if httpx.get(url + '/health').status_code == 200: break
        except httpx.TransportError: pass
        time.sleep(0.2)
    rng = np.random.default_rng(0)
    mid = httpx.get(url + '/v1/models').json()['data'][0]['id']
    for n in (1024,) * 6:
        body = {"model": mid, "prompt": rng.integers(1000, 20000, size=n).tolist(), "max_tokens": 4, "ignore_eos": True, "stream": True}
        t = time.perf_counter(); first = None
        with httpx.stream('POST', url + '/v1/completions', json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith('data:') and first is None and 'choices' in line:
                    first = time.perf_counter() - t
        print(f"{n} tokens: TTFT {1e3*first:.0f} ms, total {1e3*(time.perf_counter()-t):.0f} ms")
finally:
    os.killpg(p.pid, signal.SIGTERM); p.wait()
