"""llama-server's `/tokenize` and `/detokenize`, with its request and response shapes.

    POST /tokenize    {"content": "...", "add_special": false, "with_pieces": false} -> {"tokens": [...]}
    POST /detokenize  {"tokens": [...]}                                             -> {"content": "..."}

Tokens are the model's own (the same the completion endpoints would compute for that text);
`with_pieces` answers [{"id", "piece"}] with the piece as text, or as its bytes where they are
not valid UTF-8 on their own (as llama-server does). Pure parsing here, the routes in `app`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from . import fields as F
from .api_errors import bad_request

MAX_TOKENS = 1 << 20  # token ids in one /detokenize request


def parse_tokenize(data: Mapping[str, Any]) -> tuple[str, bool, bool, tuple[str, ...]]:
    """(content, add_special, with_pieces, ignored fields). llama-server's add_special defaults to false."""
    ignored = F.check_fields(data, {"content", "add_special", "with_pieces", "model"})
    content = data.get("content")
    if not isinstance(content, str):
        raise bad_request(f"'content' must be a string, got {content!r:.100}", param="content",
                          code="missing_required_parameter" if content is None else "invalid_type")
    add_special = F.want(data, "add_special", lambda v: isinstance(v, bool), "a boolean", False)
    with_pieces = F.want(data, "with_pieces", lambda v: isinstance(v, bool), "a boolean", False)
    return content, add_special, with_pieces, ignored


def parse_detokenize(data: Mapping[str, Any], n_vocab: int) -> tuple[list[int], tuple[str, ...]]:
    """(token ids, ignored fields); every id must lie in the vocabulary."""
    ignored = F.check_fields(data, {"tokens", "model"})
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS or not all(F.is_int(t) for t in tokens):
        raise bad_request(f"'tokens' must be a list of token ids, got {tokens!r:.100}", param="tokens",
                          code="missing_required_parameter" if tokens is None else "invalid_type")
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"token ids must lie in [0, {n_vocab}), got {bad}", param="tokens")
    return tokens, ignored


def with_pieces(tokens: Sequence[int], piece: Callable[[int], bytes]) -> list[dict[str, Any]]:
    out = []
    for t in tokens:
        raw = piece(t)
        try:
            text: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = list(raw)
        out.append({"id": t, "piece": text})
    return out


def detokenize(tokens: Sequence[int], piece: Callable[[int], bytes]) -> str:
    """The pieces' bytes joined, then decoded (a character split across tokens comes out whole)."""
    return b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")
