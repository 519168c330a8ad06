"""Per-request text: incremental UTF-8 decoding and stop strings that never leak into the output
(unless the request asks for them: vLLM's `include_stop_str_in_output`)."""

from __future__ import annotations

import codecs


class StopMatcher:
    """Emits text as it arrives, holding back any tail that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...], include: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include = include  # a stop string found is emitted (what follows it is still dropped)
        self._held = ""

    def push(self, text: str, check: bool = True) -> tuple[str, bool]:
        """(text safe to emit, stopped). On a stop, what follows the stop string is dropped, and the
        stop string too unless `include`. `check=False` (vLLM's min_tokens not reached yet) looks for
        no stop string but still holds back a tail that may begin one, so a stop string that the
        next tokens complete is found then."""
        if not self.stops:
            return text, False
        buf = self._held + text
        if check:
            hits = [(i, -len(s)) for s in self.stops if (i := buf.find(s)) >= 0]
            if hits:
                self._held = ""
                at, minus_len = min(hits)  # the earliest; at one place, the longest
                return buf[: at - minus_len if self.include else at], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class TextAssembler:
    """Token pieces (bytes) -> text events, with stop strings."""

    def __init__(self, stops: tuple[str, ...], include: bool = False) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = StopMatcher(stops, include)

    def push(self, piece: bytes, check: bool = True) -> tuple[str, bool]:
        return self._stops.push(self._utf8.decode(piece), check)

    def flush(self) -> str:
        text, stopped = self._stops.push(self._utf8.decode(b"", final=True))
        return text if stopped else text + self._stops.flush()
