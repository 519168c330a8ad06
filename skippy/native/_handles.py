"""What the native wrappers hold of each other, as structural types: a tokenizer borrows its
model's pointer, a model closes the contexts made on it before it frees itself.

Apart from model, context and tokenizer so each can name the part of another it uses without
importing it: context imports model, model makes its tokenizer, and the annotations back (model
naming Context, tokenizer naming Model) closed a circle, even if only under TYPE_CHECKING.
"""

from __future__ import annotations

from typing import Any, Protocol


class ModelHandle(Protocol):
    """A model as its tokenizer sees it: the llama_model pointer while open."""

    def _handle(self) -> Any:
        """The live pointer; ClosedError once the model is closed."""
        ...


class Closable(Protocol):
    """A context as its model sees it: closed before the model is freed."""

    def close(self) -> None: ...
