"""lm-evaluation-harness (`lm-eval[api]`, unmodified) driving a live server on SmolLM2 through its
`local-completions` model, on the tiny tasks in lm_eval_task/: multiple choice scored by loglikelihood
(echo + logprobs over token ids) and a generate_until item. Its tokenizer is the server's own, through
the `remote` backend (vLLM's /tokenizer_info and /tokenize), so nothing is downloaded: the datasets are
local JSONL files and the hub is offline. Each loglikelihood it logs must equal the engine's own score
of that continuation, and the generation a greedy completion with the same stop strings."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import trio

from ._live import live_server

pytestmark = pytest.mark.server

TASK_DIR = Path(__file__).parent / "lm_eval_task"
MODEL = "test-model"


def _encode_pair(engine, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a request (TemplateLM._encode_pair), with the engine's tokenizer: trailing
    spaces of the context move to the continuation; the whole is tokenized once and the context's own
    tokens split it."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = engine.tokenize(context + continuation, False).tolist()
    n = len(engine.tokenize(context, False).tolist())
    return whole[:n], whole[n:]


async def _loglikelihood(engine, context: str, continuation: str) -> float:
    """The engine's score of the continuation: its tokens' logprobs given everything before them."""
    ctx, cont = _encode_pair(engine, context, continuation)
    events = [e async for e in engine.generate(ctx + cont, {"temperature": 0}, max_tokens=0, prompt_logprobs=0)]
    scored = events[0].prompt_logprobs  # one per token after the first
    assert len(scored) == len(ctx) + len(cont) - 1
    return sum(lp.logprob for lp in scored[len(ctx) - 1:])


async def _greedy(engine, context: str, max_tokens: int, stop: list[str]) -> str:
    events = [e async for e in engine.generate(engine.tokenize(context, False), {"temperature": 0},
                                               max_tokens=max_tokens, stop=stop)]
    return "".join(e.text for e in events)


async def test_lm_eval_local_completions(smollm2, monkeypatch, tmp_path):
    # offline, and every cache in tmp_path (read when datasets is imported: set before lm_eval loads it)
    for name, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
                        "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "TOKENIZERS_PARALLELISM": "false"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(TASK_DIR)  # the task configs name their JSONL files relative to it
    import lm_eval
    from lm_eval.tasks import TaskManager

    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, engine):
            from lm_eval.utils import check_remote_tokenizer_support

            # what lm-eval's default tokenizer_backend=auto probes: it would pick `remote` too
            assert await trio.to_thread.run_sync(check_remote_tokenizer_support, f"{url}/v1/completions")
            model_args = (f"base_url={url}/v1/completions,model={MODEL},tokenizer_backend=remote,"
                          "tokenized_requests=True,num_concurrent=1,max_retries=1")
            run = partial(lm_eval.simple_evaluate, model="local-completions", model_args=model_args,
                          tasks=["skippy_mc", "skippy_gen"], log_samples=True, bootstrap_iters=0,
                          task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False))
            out = await trio.to_thread.run_sync(run, abandon_on_cancel=True)

            assert set(out["results"]) == {"skippy_mc", "skippy_gen"}
            assert 0 <= out["results"]["skippy_mc"]["acc,none"] <= 1
            assert "exact_match,none" in out["results"]["skippy_gen"]

            mc = out["samples"]["skippy_mc"]
            assert len(mc) == 4
            for sample in mc:
                assert len(sample["arguments"]) == len(sample["doc"]["choices"])
                for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
                    logged, _greedy_flag = resp[0]
                    ours = await _loglikelihood(engine, context, continuation)
                    assert logged == ours, (context, continuation, logged, ours)  # the same floats, summed alike
                    assert math.isfinite(logged) and logged < 0

            (gen,) = out["samples"]["skippy_gen"]
            context, gen_kwargs = gen["arguments"][0]
            eos = engine.runtime.model.tokenizer.piece(engine.runtime.model.tokenizer.eos, special=True).decode()
            want = await _greedy(engine, context, gen_kwargs["max_gen_toks"], [*gen_kwargs["until"], eos])
            assert gen["resps"][0][0] == want
            assert want  # something was generated
