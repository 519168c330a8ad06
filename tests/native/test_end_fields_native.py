"""min_tokens and stop_token_ids on the real library (SmolLM2, greedy): the mask touches only the
end ids, so the tokens before the end the model would have picked are the unmasked run's own."""

from __future__ import annotations

import pytest
import trio

import skippy

pytestmark = pytest.mark.native


async def _tokens(engine, prompt, **kw) -> tuple[list[int], str, str]:
    events = [e async for e in engine.generate(prompt, max_tokens=kw.pop("max_tokens", 64), **kw)]
    return [e.token for e in events if e.token is not None], "".join(e.text for e in events), events[-1].finish_reason


async def test_min_tokens_and_stop_token_ids_on_smollm2(smollm2_path):
    with trio.fail_after(120):
        async with skippy.open_engine(smollm2_path, n_ctx=1024, n_batch=128, threads=1) as engine:
            prompt = engine.chat_tokens([{"role": "user", "content": "Say hi in two words."}])
            plain, text, reason = await _tokens(engine, prompt)
            assert reason == "stop" and 2 <= len(plain) < 40, "the reference must end by itself"
            ends = [t for t in range(engine.runtime.n_vocab) if engine.runtime.is_eog(t)]
            assert plain[-1] in ends
            held, _, _ = await _tokens(engine, prompt, min_tokens=len(plain) + 6)
            assert held[: len(plain) - 1] == plain[:-1]  # bit for bit until the end it could not pick
            assert len(held) >= len(plain) + 6 and not set(ends) & set(held[: len(plain) + 6])
            stop = plain[1]
            cut, cut_text, why = await _tokens(engine, prompt, stop_token_ids=[stop])
            assert cut == plain[: plain.index(stop) + 1] and why == "stop" and text.startswith(cut_text)
