"""The multi-turn chat workload the replica benchmark routes: pure, seeded, no I/O.

S sessions share one system prompt; each has 4-6 turns (seeded), and each turn's messages are the
system prompt, every earlier user turn with the answer it got, and the new user turn, so a
session's prompt grows and every turn begins with the one before it. About a tenth of all
requests are one-shots: a unique user message with no system prompt and no history, put at
seeded places in the sessions' sequences (they share nothing, and compete for the caches).
Text is words drawn from a fixed list, so prompt lengths are close to the word counts in tokens.
"""

from __future__ import annotations

import attrs
import numpy as np

WORDS = tuple("""
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community
name president team minute idea kid body information back parent face others level office door health
person art war history party result change morning reason research girl guy moment air teacher force
education foot boy age policy music market sense nation plan college interest death experience effect
class control care field development role effort rate heart drug show leader light voice wife police
mind price report decision son view relationship town road arm difference value building action model
season society tax director position player record paper space ground form event official matter center
couple site project activity star table need court oil situation cost industry figure street image phone
data picture practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window evidence
population site river garden summer winter bridge island ocean forest valley mountain engine signal
""".split())


@attrs.frozen
class Request:
    """One request of a session's sequence: a chat turn (with its turn number) or a one-shot."""

    session: int
    turn: int  # 1.. within the session; 0 for a one-shot
    user: str

    @property
    def one_shot(self) -> bool:
        return self.turn == 0


@attrs.frozen
class Script:
    system: str
    sessions: tuple[tuple[Request, ...], ...]

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.sessions)

    @property
    def one_shots(self) -> int:
        return sum(r.one_shot for s in self.sessions for r in s)


def _text(rng: np.random.Generator, words: int, tag: str) -> str:
    """`words` words led by a tag that makes the text unique from its first token."""
    return f"{tag}: " + " ".join(rng.choice(WORDS, size=words))


def make_script(sessions: int, *, turns: tuple[int, int] = (4, 6), system_words: int = 200, user_words: int = 40,
                one_shot_share: float = 0.1, seed: int = 0) -> Script:
    """The whole workload, the same for every replica count and policy given the same arguments."""
    if sessions < 1 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError(f"need sessions >= 1 and 1 <= turns[0] <= turns[1], got {sessions}, {turns}")
    if not 0 <= one_shot_share < 1:
        raise ValueError(f"one_shot_share must be in [0, 1), got {one_shot_share}")
    rng = np.random.default_rng(seed)
    system = _text(rng, system_words, "You are a helpful assistant. Context")
    counts = rng.integers(turns[0], turns[1] + 1, size=sessions)
    chat = [[Request(s, t, _text(rng, user_words, f"Session {s} turn {t} question")) for t in range(1, n + 1)]
            for s, n in enumerate(counts)]
    # one-shots are the share of all requests: k / (turns + k) = share
    k = round(one_shot_share * int(counts.sum()) / (1 - one_shot_share))
    owners = rng.integers(0, sessions, size=k)
    for j, s in enumerate(owners):
        at = int(rng.integers(0, len(chat[s]) + 1))
        chat[s].insert(at, Request(int(s), 0, _text(rng, system_words + user_words, f"One-off request {j}")))
    return Script(system, tuple(tuple(c) for c in chat))


def messages(script: Script, request: Request, history: list[tuple[str, str]]) -> list[dict[str, str]]:
    """The chat messages of `request`; `history` is the session's (user, answer) pairs so far."""
    if request.one_shot:
        return [{"role": "user", "content": request.user}]
    out = [{"role": "system", "content": script.system}]
    for user, answer in history:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return out + [{"role": "user", "content": request.user}]
