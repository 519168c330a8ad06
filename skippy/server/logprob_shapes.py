"""OpenAI's logprobs shapes, and the choices that carry them (echo, logprobs), streamed or not. Pure:
no engine, no HTTP; token text comes from a `piece` function (the runtime's, read-only vocabulary).

- completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`; with echo the prompt's
  tokens come first, the first one's logprob and alternatives null; `top_logprobs` maps token text to
  logprob for the k most likely tokens, plus the chosen one (as vLLM and OpenAI's legacy API).
- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.

`text_offset` is each token's character offset in the choice's text: prompt tokens from 0 (their
pieces laid end to end), generated tokens from the end of the echoed prompt text.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..scheduling.logprobs import TokenLogprob


class Pieces:
    """Token id -> its bytes and text, memoised (the vocabulary never changes)."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._text: dict[int, tuple[bytes, str]] = {}

    def get(self, token: int) -> tuple[bytes, str]:
        got = self._text.get(token)
        if got is None:
            b = bytes(self._piece(int(token)))
            got = self._text[token] = (b, b.decode("utf-8", errors="replace"))
        return got

    def text(self, token: int) -> str:
        return self.get(token)[1]


def completion_logprobs(entries: Sequence[TokenLogprob | None], tokens: Sequence[int], pieces: Pieces,
                        offset: int = 0) -> tuple[dict[str, Any], int]:
    """The completions shape for `tokens` (an entry None: no logprob, the prompt's first token), their
    offsets from `offset`; and the offset after them."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp, token in zip(entries, tokens):
        text = pieces.text(token)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(lp.logprob)
        top = {pieces.text(t): v for t, v in lp.top}
        top.setdefault(text, lp.logprob)
        out["top_logprobs"].append(top)
    return out, offset


def chat_logprobs(entries: Sequence[TokenLogprob], pieces: Pieces) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        b, text = pieces.get(token)
        return {"token": text, "logprob": logprob, "bytes": list(b)}

    return {"content": [{**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
                        for lp in entries],
            "refusal": None}


def merge_completion(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for k in out:
            out[k].extend(p[k])
    return out


class ChoiceView:
    """One choice of a request that asked for logprobs or echo: its prompt (what echo returns) and how its
    events render, whole (`full`) or chunk by chunk (`chunks`)."""

    def __init__(self, kind: str, pieces: Pieces, logprobs: bool, echo: bool, prompt_text: str = "",
                 prompt_tokens: Sequence[int] = ()) -> None:
        self.kind = kind
        self.pieces = pieces
        self.logprobs = logprobs
        self.echo = echo
        self.prompt_text = prompt_text
        self.prompt_tokens = list(prompt_tokens)
        self._offset = 0
        self._started = False

    def _prompt_part(self, first_event: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        scored = list(first_event.prompt_logprobs or ())
        entries: list[TokenLogprob | None] = [None] + scored
        part, _ = completion_logprobs(entries, self.prompt_tokens[: len(entries)], self.pieces, 0)
        return part

    def _token_part(self, events: Sequence[Any]) -> Any:
        sampled = [e for e in events if e.token is not None and e.logprob is not None]
        if self.kind == "chat":
            return chat_logprobs([e.logprob for e in sampled], self.pieces)
        part, self._offset = completion_logprobs([e.logprob for e in sampled], [e.token for e in sampled],
                                                 self.pieces, self._offset)
        return part

    def full(self, events: Sequence[Any]) -> tuple[str, Any]:
        """(text, logprobs JSON or None) of a finished choice."""
        text = "".join(e.text for e in events)
        parts = []
        if self.echo:
            text = self.prompt_text + text
            prompt = self._prompt_part(events[0]) if events else None
            if prompt is not None:
                parts.append(prompt)
            self._offset = len(self.prompt_text)
        if not self.logprobs:
            return text, None
        tokens = self._token_part(events)
        return text, tokens if self.kind == "chat" else merge_completion(parts + [tokens])

    def chunks(self, event: Any) -> list[tuple[str, Any]]:
        """(text, logprobs JSON or None) content chunks for one event (a final event's finish chunk is the
        caller's): the echoed prompt before the choice's first event."""
        out: list[tuple[str, Any]] = []
        if not self._started:
            self._started = True
            if self.echo:
                out.append((self.prompt_text, self._prompt_part(event)))
                self._offset = len(self.prompt_text)
        if self.logprobs and event.token is not None:
            out.append((event.text, self._token_part([event])))
        elif event.text:
            out.append((event.text, None))
        return out
