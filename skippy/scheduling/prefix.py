"""Exact-prefix identity and the resident prefix cache: pure, no trio, no llama.

A prefix is named by a hash chain over an identity seed (model file digest,
architecture, every context setting that changes what a KV cell holds) and the
prompt's token ids in fixed blocks, so two prompts agree on block k only if they
agree on every token before it under the same model and settings. Hashes only find
candidates; a match is confirmed token by token.

Holders of a prefix are resident entries (reserved sequence ids that keep a
prompt's cells after its request is gone) and, in positional mode, running requests
(live sharing; a waiting request may share from one still prefilling, and waits
until the source has computed the shared part: in-batch dedup). Sharing itself is a
`seq_cp` done by the runtime, which may grant less than asked (family rules live in
the runtime, next to llama.cpp).

Modes:
- positional (dense, MLA): cells are per position, so any prefix length of a holder
  can be shared.
- exact (recurrent and hybrid families; ISWA, whose window cache keeps only the
  window behind a holder's end): a recurrent state exists only as a whole, after its
  last token, so a holder serves exactly its own length, to prompts that extend it. Entries are such snapshots. A running request serves a length L only if
  its prefill has not passed L: it is then told to pause there (`Request.pauses`: its
  chunk ends at L), its state at L is recorded as an entry, and waiting requests copy
  it. When two prompts share a prefix but no holder can serve it, the newcomer pauses
  at the common length itself, so the third one hits. (SGLang does the same for
  Mamba states in its radix cache.)
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, Collection, Iterable, Mapping, Sequence

import attrs
import numpy as np
from loguru import logger

from .requests import RequestState

DEFAULT_BLOCK = 16
_GONE = -1  # a share's source left


def identity_seed(model_digest: str, arch: str, settings: Mapping[str, Any]) -> bytes:
    """The root of every hash chain: a cell is reusable only under the same model and KV settings."""
    text = repr((model_digest, arch, sorted((str(k), repr(v)) for k, v in settings.items())))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def block_hashes(seed: bytes, tokens: np.ndarray, block: int) -> list[bytes]:
    """hashes[k] names tokens[: (k + 1) * block] (whole blocks only)."""
    data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    step = 4 * block
    out, prev = [], seed
    for k in range(len(tokens) // block):
        prev = hashlib.blake2b(prev + data[k * step : (k + 1) * step], digest_size=16).digest()
        out.append(prev)
    return out


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    m = min(a.size, b.size)
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


@attrs.define(eq=False)
class Entry:
    """A resident prefix: `tokens` are held in the cells of reserved sequence `seq_id`."""

    seq_id: int
    tokens: np.ndarray
    hashes: list[bytes]
    last_used: int

    @property
    def length(self) -> int:
        return int(self.tokens.size)


@attrs.frozen
class Share:
    """A promise made at admission: `length` prompt tokens will come from `source` (Entry or Request)."""

    source: Any
    length: int

    @property
    def resident(self) -> bool:
        return isinstance(self.source, Entry)


class PrefixCache:
    def __init__(
        self,
        seed: bytes,
        seq_ids: Iterable[int],
        budget_tokens: int,
        *,
        block: int = DEFAULT_BLOCK,
        exact: bool = False,
    ) -> None:
        self.seed = seed
        self.block = block
        self.exact = exact
        self.budget_tokens = budget_tokens
        self.entries: dict[int, Entry] = {}
        self._free_ids = sorted(seq_ids, reverse=True)
        self._index: dict[bytes, dict[int, Any]] = {}  # chain hash -> holders by id()
        self._live: dict[int, Any] = {}  # running requests registered as sources
        self._clock = itertools.count()

    # -- hashing -------------------------------------------------------------------

    def hashes(self, request: Any) -> list[bytes]:
        """The request's prompt block hashes, computed once."""
        if request.prefix_hashes is None:
            request.prefix_hashes = block_hashes(self.seed, request.prompt, self.block)
        return request.prefix_hashes

    def _add(self, holder: Any, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self._index.setdefault(h, {})[id(holder)] = holder

    def _remove(self, holder: Any, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            bucket = self._index.get(h)
            if bucket is not None:
                bucket.pop(id(holder), None)
                if not bucket:
                    del self._index[h]

    # -- the lifecycle of a request, as the step drives it ----------------------------------
    # admitted -> copy_source (each step until its promised prefix is copied in) -> shared ->
    # prefilled (its prompt is kept as an entry) -> released. Entries leave by plan_record's
    # evictions (budget) and by lru (memory pressure); the step frees their cells.

    def admitted(self, request: Any) -> None:
        """A request took a lane: it becomes a live source of its prompt's prefixes."""
        if self.exact:
            self._plan_snapshot(request)
        if id(request) not in self._live:
            self._live[id(request)] = request
            self._add(request, self.hashes(request))
        if request.share is not None and request.share.resident:
            self.touch(request.share.source)

    def released(self, request: Any) -> None:
        """A request left the running set (finished, cancelled, failed, preempted): no longer a source."""
        if self._live.pop(id(request), None) is not None:
            self._remove(request, self.hashes(request))

    def _plan_snapshot(self, r: Any) -> None:
        """Recurrent state: a live source pauses where it is shared; else r pauses where prompts part."""
        if r.share is not None and not r.share.resident:
            r.share.source.pauses.add(r.share.length)
        elif r.share is None:
            common = self.common(r)
            if self.block <= common < r.prompt.size:
                r.pauses.add(common)

    def protected(self, running: Sequence[Any]) -> set[int]:
        """Entries a running request is about to copy from: never evicted before it has."""
        return {r.share.source.seq_id for r in running if r.share is not None and r.share.resident}

    def _source_seq(self, share: Share, running: Sequence[Any]) -> int | None:
        """The sequence to copy from now; None while a live source is still computing the prefix,
        _GONE when the source is gone."""
        src = share.source
        if share.resident:
            return src.seq_id if self.entries.get(src.seq_id) is src else _GONE
        if src.state is not RequestState.RUNNING or src.seq_id is None or src.cancel_requested \
                or src not in running:
            return _GONE
        if src.cached < share.length:
            return None
        if self.exact and src.cached > share.length:
            return _GONE  # its state moved on (its snapshot, if recorded, is an entry now)
        return src.seq_id

    def copy_source(self, request: Any, running: Sequence[Any]) -> int | None:
        """The sequence `request`'s promised prefix can be copied from now, or None (not yet, or
        never: a request whose source left is matched again, or computes its own)."""
        seq = self._source_seq(request.share, running)
        if seq == _GONE:  # its source left (finished, cancelled, preempted, evicted): look again
            request.share = self.match(request, ())
            seq = self._source_seq(request.share, running) if request.share is not None else None
            if seq == _GONE:
                request.share = None
            elif request.share is not None and seq is None and self.exact:
                request.share.source.pauses.add(request.share.length)  # a live source stops where it is shared
        return None if seq == _GONE else seq

    def shared(self, request: Any, granted: int) -> None:
        """The copy is done: `granted` prompt tokens are in memory without being computed."""
        request.share = None
        request.cached = request.shared_tokens = granted

    def unwedge(self, running: Sequence[Any]) -> None:
        """If every running request waits for a prefix, nobody computes it: each computes its own.

        Never expected (match() takes no source that itself waits); kept so a bug cannot hang the engine."""
        if running and all(r.share is not None for r in running):
            for r in running:
                r.share = None
            logger.warning("{} requests waited for shared prefixes nobody computes; they compute their own",
                           len(running))

    def prefilled(self, chunks: Iterable[Any]) -> list[tuple[Any, int]]:
        """(request, length) for each prompt a step's chunks finished prefilling and that is worth keeping:
        the whole prompt, or for a recurrent state exactly where the chunk ended at a planned pause."""
        out = []
        for c in chunks:
            r, end = c.request, c.start + c.n
            if r.seq_id is None or r.cancel_requested:
                continue
            if self.exact:
                if end != r.prompt.size and end not in r.pauses:
                    continue
                p = end
            else:
                p = int(r.prompt.size)
                if not c.start < p <= end:
                    continue
            out.append((r, p))
        return out

    # -- lookup ---------------------------------------------------------------------

    def _candidates(self, request: Any, extra: Sequence[Any]) -> list[Any]:
        """Holders of the request's longest indexed block prefix, and this round's admissions."""
        hashes = self.hashes(request)
        found: list[Any] = []
        for k in range(len(hashes), 0, -1):
            bucket = self._index.get(hashes[k - 1])
            if bucket:
                found = list(bucket.values())
                break
        return [h for h in found + [r for r in extra if r not in found] if h is not request]

    def match(self, request: Any, extra: Sequence[Any] = ()) -> Share | None:
        """The longest prefix of `request` that some holder has or will have; None below one block.

        At least one token is always left to compute: its logits are the first sample.
        `extra` are requests admitted in the same round (not yet registered as live).
        """
        limit = request.n_tokens - 1
        best: Share | None = None
        for holder in self._candidates(request, extra):
            is_entry = isinstance(holder, Entry)
            if not is_entry and holder.share is not None:
                continue  # its cells are only promised: two such requests could wait on each other forever
            lcp = common_prefix(holder.tokens if is_entry else holder.prompt, request.prompt)
            if not self.exact:
                length = min(lcp, limit)
            elif is_entry:  # a snapshot: all of it, to a prompt that extends it
                length = holder.length if holder.length <= min(lcp, limit) else 0
            else:  # a running request that can still pause where the prompts part
                length = min(lcp, limit)
                if holder.held > length:
                    length = 0
            if length < self.block:
                continue
            if best is None or length > best.length or (length == best.length and is_entry and not best.resident):
                best = Share(holder, length)
        return best

    def common(self, request: Any) -> int:
        """The longest prefix `request` has in common with any holder (shareable or not)."""
        return max((common_prefix(h.tokens if isinstance(h, Entry) else h.prompt, request.prompt)
                    for h in self._candidates(request, ())), default=0)

    def touch(self, entry: Entry) -> None:
        entry.last_used = next(self._clock)

    # -- recording and eviction --------------------------------------------------------

    @property
    def resident_tokens(self) -> int:
        return sum(e.length for e in self.entries.values())

    def covered(self, tokens: np.ndarray) -> Entry | None:
        """An entry that already serves every prefix `tokens` could offer."""
        hashes = block_hashes(self.seed, tokens, self.block)
        bucket = self._index.get(hashes[-1]) if hashes else None
        for holder in (bucket or {}).values():
            if isinstance(holder, Entry) and common_prefix(holder.tokens, tokens) == tokens.size:
                if holder.length == tokens.size or not self.exact:
                    return holder
        return None

    def plan_record(self, tokens: np.ndarray, protected: Collection[int] = ()) -> list[Entry] | None:
        """Whether to keep `tokens` (a just-prefilled prompt): None, or the entries to evict first.

        None when it is too short, already covered, bigger than the budget, or no room can
        be made without evicting a `protected` entry (by seq id: one a request is about to
        copy from). In positional mode, entries the new one contains are evicted (it serves
        their prefixes). The caller frees the evicted entries, then calls `add`.
        """
        n = int(tokens.size)
        if n < self.block or n > self.budget_tokens:
            return None
        have = self.covered(tokens)
        if have is not None:
            self.touch(have)
            return None
        evict: list[Entry] = []
        if not self.exact:
            evict = [e for e in self.entries.values()
                     if e.seq_id not in protected and common_prefix(e.tokens, tokens) == e.length]
        kept = [e for e in self.entries.values() if e not in evict]

        def room() -> bool:
            return len(self._free_ids) + len(evict) > 0 and sum(k.length for k in kept) + n <= self.budget_tokens

        for e in sorted(kept, key=lambda e: e.last_used):
            if room():
                break
            if e.seq_id not in protected:
                evict.append(e)
                kept.remove(e)
        return evict if room() else None

    def add(self, tokens: np.ndarray) -> Entry:
        """A new entry for `tokens` on a free reserved id (after plan_record's evictions are freed)."""
        seq_id = self._free_ids.pop()
        entry = Entry(seq_id, tokens.copy(), block_hashes(self.seed, tokens, self.block), next(self._clock))
        self.entries[seq_id] = entry
        self._add(entry, entry.hashes)
        return entry

    def drop(self, entry: Entry) -> None:
        """Forget an entry (the caller frees its sequence's cells before the id is used again)."""
        if self.entries.get(entry.seq_id) is entry:
            del self.entries[entry.seq_id]
            self._remove(entry, entry.hashes)
            self._free_ids.append(entry.seq_id)
            self._free_ids.sort(reverse=True)

    def lru(self, protected: Collection[int] = ()) -> Entry | None:
        """The least recently used entry that is not `protected` (by seq id)."""
        free = [e for e in self.entries.values() if e.seq_id not in protected]
        return min(free, key=lambda e: e.last_used) if free else None
