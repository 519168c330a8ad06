"""The served goodput pattern in simulated time: the engine's own step over a FakeRuntime whose steps cost
what this run's Gemma-3 steps fit (19 ms + 3.8 ms a decode row + 1.5 ms a prompt token), 128 in / 64 out,
200 Poisson requests; goodput and TTFT quantiles, SLO planning vs filling steps. Usage: LABEL scaled|fixed.
At 2e8ff68: scaled, 1x goodput 1.27 (fill 0.196), 1.5x 1.009 (fill 0): 0.79x, milder than served (0.53x)."""
import sys, json, numpy as np
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[4]))
from skippy.testing import FakeRuntime, SyncScheduler
PROMPT, OUT = 128, 64

def cost(rows, prompt):
    return 0.019 + 0.0038 * rows + 0.0015 * prompt

def run(rate, n=200, seed=0, ttft=2.0, tpot=0.2, **config):
    rt = FakeRuntime(n_ctx=12288, n_batch=512, n_seq_max=64, n_vocab=64, step_cost=cost)
    sim = SyncScheduler(rt, max_waiting=1024, prefix_cache=False, **config)
    rng = np.random.default_rng(seed)
    start = rt.clock()
    arrivals = start + np.concatenate(([0.0], np.cumsum(rng.exponential(1 / rate, n - 1))))
    sent = {}; i = 0
    for _ in range(2_000_000):
        while i < n and arrivals[i] <= rt.clock():
            r = sim.submit([(7 * i + k) % 60 + 1 for k in range(PROMPT)], OUT, ignore_eos=True)
            sent[r.id] = arrivals[i]; i += 1
        busy = sim.admission.waiting or sim.running or not sim.scheduler.idle
        if not busy:
            if i == n: break
            rt.clock.advance(max(0.0, arrivals[i] - rt.clock())); continue
        sim.step()
    met = 0; ttfts = []; tpots = []
    for r in sim.requests:
        times, events = sim.event_times[r.id], sim.events[r.id]
        t_first = next(t for t, e in zip(times, events) if e.token is not None)
        tp = (times[-1] - t_first) / (len(r.generated) - 1)
        tf = t_first - sent[r.id]
        ttfts.append(tf); tpots.append(tp)
        met += int(tf <= ttft and tp <= tpot)
    dur = rt.clock() - start
    q = lambda xs, p: float(np.quantile(xs, p))
    return dict(goodput=round(met / dur, 3), met=met, dur=round(dur, 1), p50=round(q(ttfts, .5), 2),
                p90=round(q(ttfts, .9), 2), p99=round(q(ttfts, .99), 2), tpot50=round(1e3 * q(tpots, .5), 1))

if __name__ == '__main__':
    which = sys.argv[1]
    burst = run(1e6, slo_scheduling=False)
    cap = 200 / burst['dur']
    print('capacity', round(cap, 3))
    slos = {'fixed': (2.0, 0.2), 'scaled': (2.092, 0.0695)}
    for name in sys.argv[2:]:
        T, P = slos[name]
        for f in (1.0, 1.5):
            for seed in (0,):
                on = run(f * cap, seed=seed, ttft=T, tpot=P, ttft_slo_ms=T * 1e3, tpot_slo_ms=P * 1e3)
                off = run(f * cap, seed=seed, ttft=T, tpot=P, slo_scheduling=False)
                print(which, name, f, seed, 'slo', json.dumps(on), '| fill', json.dumps(off), flush=True)
