"""llama-server's `/tokenize` and `/detokenize`, with its request and response shapes.

    POST /tokenize    {"content": "...", "add_special": false, "with_pieces": false} -> {"tokens": [...]}
    POST /detokenize  {"tokens": [...]}                                             -> {"content": "..."}

and what lm-evaluation-harness's `remote` tokenizer (vLLM's endpoints) reads: `/tokenize` also takes vLLM's
names, `prompt` (= `content`) and `add_special_tokens` (= `add_special`, false unless given under either
name), and `GET /tokenizer_info` answers `{"bos_token", "eos_token", "chat_template", "model_max_length"}`.

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
    ignored = F.check_fields(data, {"content", "prompt", "add_special", "add_special_tokens", "with_pieces", "model"})
    name = F.one_of(data, ("content", "prompt")) or "content"  # prompt: vLLM's name
    content = data.get(name)
    if not isinstance(content, str):
        raise bad_request(f"'{name}' must be a string, got {content!r:.100}", param=name,
                          code="missing_required_parameter" if content is None else "invalid_type")
    special = F.one_of(data, ("add_special", "add_special_tokens")) or "add_special"
    add_special = F.want(data, special, lambda v: isinstance(v, bool), "a boolean", False)
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


def tokenizer_info(engine: Any) -> dict[str, Any]:
    """vLLM's /tokenizer_info, what lm-evaluation-harness's `remote` tokenizer needs: the special tokens'
    text (null when the runtime has no model to read them from), the chat template and the context."""
    model = getattr(engine.runtime, "model", None)
    info: dict[str, Any] = {"bos_token": None, "eos_token": None, "chat_template": None,
                            "model_max_length": engine.n_ctx}
    if model is not None:
        tok = model.tokenizer
        for key, token in (("bos_token", tok.bos), ("eos_token", tok.eos)):
            if token >= 0:
                info[key] = tok.piece(token, special=True).decode("utf-8", "replace")
        info["chat_template"] = model.chat_template
    return info
