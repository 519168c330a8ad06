"""n > 1 as forks of one prompt: pure, no trio, no llama.

Choice 0 of a request is an ordinary request; choices 1..n-1 are forks (`Request.fork_of`) queued right
behind it. A fork admitted while its parent runs is promised the parent's first P - 1 prompt cells (a
prefix.Share whose source is the parent, the mechanism the prefix cache uses for running sources): once
the parent has computed them, the step copies them in with `seq_cp` (shared cells, nothing copied),
and the fork computes only the prompt's last token itself, so its first sample comes from its own row
(the same bytes as the parent's under batch invariance) and it then decodes on its own lane. A fork
whose parent has left (finished, cancelled, preempted) before the copy computes its own prompt, which
is what n separate requests would do: correct either way. In exact mode (recurrent state, sliding
window) the parent pauses its prefill at P - 1 so the state there can be copied whole.
"""

from __future__ import annotations

from typing import Any, Sequence

from .prefix import Share
from .requests import Request, RequestState


def fork_share(r: Request, exact: bool) -> Share | None:
    """What a fork is promised at admission: its parent's prompt cells but the last, while the parent
    runs and can still provide them; None otherwise (it computes its own prompt)."""
    parent = r.fork_of
    length = int(r.prompt.size) - 1
    if parent is None or length < 1 or not _live(parent):
        return None
    if exact and parent.cached > length:
        return None  # its state moved on past the shared length
    return Share(parent, length)


def _live(parent: Request) -> bool:
    return parent.state is RequestState.RUNNING and parent.seq_id is not None and not parent.cancel_requested


def fork_source(r: Request, running: Sequence[Any], exact: bool) -> int | None:
    """Without a prefix cache: the sequence a fork copies from now, or None (not yet; or never, when its
    parent left: the promise is dropped and the fork computes its own prompt)."""
    share = r.share
    src = share.source
    if not _live(src) or src not in running or (exact and src.cached > share.length):
        r.share = None
        return None
    return src.seq_id if src.cached >= share.length else None


def is_fork_share(r: Request) -> bool:
    return r.fork_of is not None and r.share is not None and r.share.source is r.fork_of
