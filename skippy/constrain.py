"""Constrained decoding with llguidance: a request's grammar masks its row's logits before the pick.

- `tokenizer_for(runtime)`: the model's vocabulary as an llguidance `LLTokenizer` (built once per
  runtime, ~0.2 s on a 49k vocabulary): every token's bytes (control tokens prefixed with 0xff, as
  llama.cpp's own llguidance bridge marks them), every end-of-generation token as an EOS, and
  llama.cpp's tokenizer through its C function pointer (no Python callback from Rust threads).
- `compile_grammar(runtime, spec)`: a `GrammarSpec` (JSON schema, any JSON object, GBNF/Lark, regex)
  compiled and validated once into a `Grammar`, or `GrammarError` naming why not. Compiling can take
  long for big schemas (it drops the GIL): a server runs it in a thread.
- `Grammar.constraint()`: a fresh per-request `Constraint` (a deep copy of the compiled matcher), which
  the request's Sampler applies (sampling.Sampler.constraint): `mask(logits)` sets every token the
  grammar does not allow to -inf (after the invariant logits and the request's own shaping, so the same
  grammar + seed picks the same tokens alone or in any batch), `accept(token)` advances the matcher once
  per picked token, `state()`/`restore()` roll it back with the Sampler's RNG (a failed step draws
  nothing). Once the grammar is complete (or the matcher stopped or failed) only EOS is allowed, so the
  request ends with finish_reason "stop".
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Mapping

import attrs
import numpy as np
from loguru import logger

from .errors import InvalidInputError

try:  # an optional dependency at import time: only constrained requests need it
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
except ImportError:  # pragma: no cover - installed with skippy
    llguidance = None


class GrammarError(InvalidInputError):
    """A response_format / grammar / tool schema that cannot be compiled: the message says why."""


KINDS = ("json_schema", "json_object", "grammar", "lark", "regex")
# llama.cpp's JSON whitespace (json-schema-to-grammar's `space`): nothing, a space, or a newline and up to 20
# indentation characters; llguidance's default (any run of whitespace) lets a small model loop on newlines.
# A schema's own "x-guidance" options override it.
JSON_DEFAULTS = {"whitespace_pattern": r"(?:\x20|\n[\x20\t]{0,20})?"}


@attrs.frozen
class GrammarSpec:
    """What a request constrains its output to. `source` is the schema (a dict, or its JSON text) for
    json_schema, ignored for json_object, the grammar text otherwise (`grammar`: GBNF or Lark, as
    llama-server's `grammar` field)."""

    kind: str
    source: Any = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r} (one of {', '.join(KINDS)})")


# -- the tokenizer bridge ---------------------------------------------------------------------

_tokenizers: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _require() -> None:
    if llguidance is None:
        raise GrammarError("constrained decoding needs the 'llguidance' package")


def tokenizer_for(runtime: Any) -> Any:
    """The runtime's vocabulary as an llguidance LLTokenizer, built on first use and kept per runtime."""
    _require()
    with _lock:
        tok = _tokenizers.get(runtime)
        if tok is None:
            model = getattr(runtime, "model", None)
            tok = _from_model(model) if model is not None else _from_runtime(runtime)
            _tokenizers[runtime] = tok
        return tok


def _eos_first(main: int, eog: list[int]) -> list[int]:
    return [main] + [t for t in eog if t != main] if main >= 0 else eog


def _from_model(model: Any) -> Any:
    """From a native Model: the same bytes llama.cpp's llguidance integration feeds it."""
    tok = model.tokenizer
    n = tok.n_vocab
    tokens: list[bytes] = []
    eog: list[int] = []
    for t in range(n):
        special = tok.piece(t, special=True)
        # a control token renders only with special=True: mark it so grammars never spell it out
        if special and not tok.piece(t, special=False):
            special = b"\xff" + special
        tokens.append(special)
        if tok.is_eog(t):
            eog.append(t)
    ffi, lib = model._ffi, model._lib
    vocab = lib.llama_model_get_vocab(model._handle())
    return llguidance.LLTokenizer.from_llamacpp(
        tokens=tokens, vocab_ptr=int(ffi.cast("uintptr_t", vocab)),
        tokenize_fptr=int(ffi.cast("uintptr_t", ffi.addressof(lib, "llama_tokenize"))),
        eos_token=_eos_first(tok.eos, eog))


class _RuntimeVocab:
    """A Runtime's pieces and tokenizer in the shape llguidance.TokenizerWrapper reads (a fake runtime)."""

    def __init__(self, runtime: Any) -> None:
        self._rt = runtime
        self.tokens = [runtime.piece(t) for t in range(runtime.n_vocab)]
        eog = [t for t in range(runtime.n_vocab) if runtime.is_eog(t)]
        self.eos_token_id = eog[0] if eog else 0
        self.eos_ids = eog or [0]
        self.bos_token_id = None
        self.special_token_ids = list(eog)

    def __call__(self, text: Any) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return [int(t) for t in self._rt.tokenize(text, add_special=False)]


def _from_runtime(runtime: Any) -> Any:
    vocab = _RuntimeVocab(runtime)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=runtime.n_vocab,
                                  eos_token=vocab.eos_ids)


# -- grammars -----------------------------------------------------------------------------------


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar of a spec (not yet validated)."""
    _require()
    try:
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
        if spec.kind == "json_schema":
            schema = spec.source
            if isinstance(schema, str):
                schema = json.loads(schema)
            if not isinstance(schema, Mapping):
                raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
            return llguidance.LLMatcher.grammar_from_json_schema(dict(schema), defaults=JSON_DEFAULTS)
        if not isinstance(spec.source, str) or not spec.source.strip():
            raise GrammarError(f"a {spec.kind} grammar must be a non-empty string")
        if spec.kind == "grammar":
            return llguidance.grammar_from("grammar", spec.source)
        if spec.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(spec.source)
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    except GrammarError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise GrammarError(f"the {spec.kind} could not be compiled: {exc}") from None


class Grammar:
    """A compiled, validated grammar over one tokenizer: `constraint()` gives each request its own state."""

    def __init__(self, spec: GrammarSpec, tokenizer: Any, text: str, matcher: Any) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.text = text
        self._matcher = matcher  # never advanced: each request deep-copies it

    def constraint(self) -> "Constraint":
        return Constraint(self._matcher.deep_copy(), self.tokenizer.eos_token)


def compile_grammar(runtime: Any, spec: GrammarSpec, *, lark: str | None = None) -> Grammar:
    """Compile `spec` (or raw llguidance `lark` text) for `runtime`'s vocabulary; GrammarError if it cannot be."""
    tokenizer = tokenizer_for(runtime)
    text = llguidance.LLMatcher.grammar_from_lark(lark) if lark is not None else grammar_text(spec)
    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, tokenizer)
    except Exception as exc:  # defensive: the validator reports errors as values
        raise GrammarError(f"the {spec.kind} could not be compiled: {exc}") from None
    if is_error:
        raise GrammarError(f"the {spec.kind} could not be compiled: {messages[0] if messages else 'invalid'}")
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"the {spec.kind} could not be compiled: {matcher.get_error()}")
    return Grammar(spec, tokenizer, text, matcher)


# -- per request --------------------------------------------------------------------------------


class Constraint:
    """One request's grammar state (owned by its Sampler, used on the worker thread only)."""

    def __init__(self, matcher: Any, eos: int) -> None:
        self._m = matcher
        self.eos = int(eos)
        self._bits: np.ndarray | None = None
        self.consumed = 0  # tokens the matcher took (rollback counts these)
        self.seen = 0  # tokens accepted, including any after it stopped (forced EOS)
        self._warned = False

    def allowed(self, n: int) -> np.ndarray:
        """A bool per token id < n: what the grammar allows next (only EOS once it stopped or failed)."""
        if self._m.is_stopped() or self._m.is_error():
            if self._m.is_error() and not self._warned:
                self._warned = True
                logger.warning("grammar matcher failed ({}); ending the request", self._m.get_error())
            out = np.zeros(n, dtype=bool)
            out[min(self.eos, n - 1)] = True
            return out
        if self._bits is None:
            self._bits = allocate_token_bitmask(1, n)
        fill_next_token_bitmask(self._m, self._bits, 0)
        out = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")[:n].view(bool)
        if not out.any():  # never leave a row with nothing to pick
            out = out.copy()
            out[min(self.eos, n - 1)] = True
        return out

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` (same dtype: no float64 upcast of a whole row) with every token the grammar
        does not allow at -inf."""
        x = np.asarray(logits)
        return np.where(self.allowed(x.shape[0]), x, x.dtype.type(-np.inf))

    def accept(self, token: int) -> None:
        """Advance by the picked token (exactly once per token; past a stop nothing is consumed)."""
        self.seen += 1
        if self._m.is_stopped() or self._m.is_error():
            return
        if self._m.consume_token(int(token)):
            self.consumed += 1

    @property
    def done(self) -> bool:
        return bool(self._m.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._m.is_accepting())

    @property
    def error(self) -> str:
        return self._m.get_error() if self._m.is_error() else ""

    def state(self) -> tuple[int, int]:
        return self.consumed, self.seen

    def restore(self, state: tuple[int, int]) -> None:
        consumed, seen = state
        if self.consumed > consumed:
            self._m.rollback(self.consumed - consumed)
            self.consumed = consumed
        self.seen = seen
