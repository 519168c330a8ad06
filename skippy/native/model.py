"""A loaded GGUF model. Owns the llama_model pointer; closing it closes its contexts first."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ClosedError, InvalidInputError, ModelLoadError
from . import _lib
from ._gguf_check import check_gguf
from ._handles import Closable
from .tokenizer import Tokenizer


class Model:
    def __init__(self, path: os.PathLike[str] | str, *, n_gpu_layers: int = 0, repack: bool = True,
                 layers: tuple[int, int] | None = None) -> None:
        """`repack=False` keeps weights in their file layout: the repacked CPU kernels
        process columns in groups, so batch-invariant serving loads without them.
        `n_gpu_layers` layers (negative: all) go to a GPU when the build has one (`skippy build
        --cuda`); a CPU-only build ignores it and runs every layer on the CPU.
        `layers=(a, b)` loads a stage: layers [a, b) only (patch 0006); a stage after the first
        takes hidden states, one before the last returns them (see Context.decode)."""
        self.path = Path(path)
        self.arch = check_gguf(self.path)
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int):
            raise InvalidInputError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
        self._ffi, self._lib = _lib.load()
        params = self._lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_extra_bufts = repack
        if layers is not None:
            begin, end = layers
            if not (0 <= begin < end):
                raise InvalidInputError(f"layer range [{begin}, {end}) is empty or negative")
            params.layer_begin, params.layer_end = begin, end
        self.repack = repack
        self.n_gpu_layers = n_gpu_layers
        ptr = self._lib.llama_model_load_from_file(os.fsencode(self.path), params)
        if ptr == self._ffi.NULL:
            what = f" as a stage of layers [{layers[0]}, {layers[1]})" if layers else ""
            raise ModelLoadError(f"llama.cpp could not load {self.path} (arch {self.arch!r}){what}; see the log above")
        self._ptr: Any = ptr
        self.layers: tuple[int, int] = layers if layers is not None else (0, self._int("llama_model_n_layer"))
        self._contexts: weakref.WeakSet[Closable] = weakref.WeakSet()  # its Contexts
        self.tokenizer = Tokenizer(self, self._ffi, self._lib)

    # -- lifetime ------------------------------------------------------------

    def _handle(self) -> Any:
        if self._ptr is None:
            raise ClosedError(f"model {self.path.name} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        if self._ptr is None:
            return
        for ctx in list(self._contexts):
            ctx.close()
        self._lib.llama_model_free(self._ptr)
        self._ptr = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # safety net only; callers close deterministically
        try:
            self.close()
        except Exception:
            pass

    # -- facts ---------------------------------------------------------------

    def _int(self, fn: str) -> int:
        return int(getattr(self._lib, fn)(self._handle()))

    @property
    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self._int("llama_model_n_ctx_train")

    @property
    def n_embd(self) -> int:
        return self._int("llama_model_n_embd")

    @property
    def n_layer(self) -> int:
        return self._int("llama_model_n_layer")

    @property
    def takes_hidden(self) -> bool:
        """A stage after the first: its input is the previous stage's hidden states."""
        return self.layers[0] > 0

    @property
    def returns_hidden(self) -> bool:
        """A stage before the last: decode returns hidden states, not logits."""
        return self.layers[1] < self.n_layer

    @property
    def n_head(self) -> int:
        return self._int("llama_model_n_head")

    @property
    def n_head_kv(self) -> int:
        return self._int("llama_model_n_head_kv")

    @property
    def n_swa(self) -> int:
        return self._int("llama_model_n_swa")

    @property
    def size_bytes(self) -> int:
        return self._int("llama_model_size")

    @property
    def loaded_bytes(self) -> int:
        """Bytes of the weights this model holds: a stage's share, not the file's total."""
        return self._int("llama_model_loaded_size")

    @property
    def n_params(self) -> int:
        return self._int("llama_model_n_params")

    @property
    def is_recurrent(self) -> bool:
        return bool(self._lib.llama_model_is_recurrent(self._handle()))

    @property
    def is_hybrid(self) -> bool:
        return bool(self._lib.llama_model_is_hybrid(self._handle()))

    @property
    def description(self) -> str:
        buf = self._ffi.new("char[]", 256)
        n = self._lib.llama_model_desc(self._handle(), buf, 256)
        return self._ffi.string(buf, max(n, 0)).decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        size = 256
        while True:
            buf = self._ffi.new("char[]", size)
            n = self._lib.llama_model_meta_val_str(self._handle(), key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return self._ffi.string(buf, n).decode("utf-8", "replace")
            size = n + 1

    @property
    def chat_template(self) -> str | None:
        ptr = self._lib.llama_model_chat_template(self._handle(), self._ffi.NULL)
        return None if ptr == self._ffi.NULL else self._ffi.string(ptr).decode("utf-8", "replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *, add_assistant: bool = True,
                            template: str | None = None) -> str:
        """Render [{"role", "content"}, ...] with the GGUF's own chat template (llama.cpp's
        built-in renderer, which recognises the common template families); chatml when the
        model has none. Raises InvalidInputError for a template llama.cpp does not know."""
        tmpl = template if template is not None else self.chat_template
        keep = [(self._ffi.new("char[]", str(m["role"]).encode()), self._ffi.new("char[]", str(m["content"]).encode()))
                for m in messages]
        chat = self._ffi.new("struct llama_chat_message[]", max(len(keep), 1))
        for i, (role, content) in enumerate(keep):
            chat[i].role, chat[i].content = role, content
        c_tmpl = self._ffi.NULL if tmpl is None else self._ffi.new("char[]", tmpl.encode())
        size = 256 + 2 * sum(len(m["content"]) + len(m["role"]) for m in messages)
        while True:
            buf = self._ffi.new("char[]", size)
            n = self._lib.llama_chat_apply_template(c_tmpl, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                raise InvalidInputError("llama.cpp does not support this model's chat template")
            if n <= size:
                return self._ffi.buffer(buf, n)[:].decode("utf-8", "replace")
            size = n

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.description
        return f"<Model {self.path.name} arch={self.arch} {state}>"
