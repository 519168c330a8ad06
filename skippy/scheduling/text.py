"""Per-request text: incremental UTF-8 decoding and stop strings that never leak into the output."""

from __future__ import annotations

import codecs


class StopMatcher:
    """Emits text as it arrives, holding back any tail that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, stopped). On a stop, the stop string and what follows are dropped."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
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

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = StopMatcher(stops)

    def push(self, piece: bytes) -> tuple[str, bool]:
        return self._stops.push(self._utf8.decode(piece))

    def flush(self) -> str:
        text, stopped = self._stops.push(self._utf8.decode(b"", final=True))
        return text if stopped else text + self._stops.flush()
