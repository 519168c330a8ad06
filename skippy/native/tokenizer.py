"""Text <-> token ids through the model's own vocabulary."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ._handles import ModelHandle


class Tokenizer:
    """Borrowed from a Model; valid while the model is open."""

    def __init__(self, model: ModelHandle, ffi: Any, lib: Any) -> None:
        self._model = model
        self._ffi = ffi
        self._lib = lib

    @property
    def _vocab(self) -> Any:
        return self._lib.llama_model_get_vocab(self._model._handle())

    @property
    def n_vocab(self) -> int:
        return int(self._lib.llama_vocab_n_tokens(self._vocab))

    @property
    def bos(self) -> int:
        return int(self._lib.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(self._lib.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, int(token)))

    def tokenize(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        vocab = self._vocab
        capacity = len(data) + 8
        while True:
            out = np.empty(capacity, dtype=np.int32)
            n = self._lib.llama_tokenize(
                vocab, data, len(data), self._ffi.from_buffer("llama_token[]", out), capacity,
                add_special, parse_special,
            )
            if n >= 0:
                return out[:n].copy()
            capacity = -n

    def piece(self, token: int, *, special: bool = False) -> bytes:
        buf = self._ffi.new("char[]", 64)
        n = self._lib.llama_token_to_piece(self._vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = self._ffi.new("char[]", -n)
            n = self._lib.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, special)
        return self._ffi.buffer(buf, n)[:]

    def text_of(self, token: int) -> bytes:
        """One token's text as llama.cpp's vocab.detokenize({token}, special=true) gives it (the leading
        space an SPM vocabulary adds is stripped, spaces cleaned where the vocabulary asks): what DRY's
        breaker table is built from."""
        tok = self._ffi.new("llama_token[1]", [int(token)])
        buf = self._ffi.new("char[]", 64)
        n = self._lib.llama_detokenize(self._vocab, tok, 1, buf, 64, False, True)
        if n < 0:
            buf = self._ffi.new("char[]", -n)
            n = self._lib.llama_detokenize(self._vocab, tok, 1, buf, -n, False, True)
        return self._ffi.buffer(buf, n)[:]

    def detokenize(self, tokens: Iterable[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")
