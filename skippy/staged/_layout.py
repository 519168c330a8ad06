"""Which layers of a model are recurrent, read from its GGUF the way llama.cpp reads them.

Why: a hybrid model may only be cut after a full-attention layer (staged._splits.boundary_rule),
and which layers attend is the file's own setting, not a constant: Qwen3-Next ships
`full_attention_interval` 4, our tiny synthetic model 2, and a file may list the layers outright.
Reads the GGUF header only (gguf-py), so no weights are loaded and no native code runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ._splits import SplitError, boundary_rule

# What llama.cpp assumes when a qwen3next GGUF has neither key (src/models/qwen3next.cpp).
LLAMA_CPP_DEFAULT_INTERVAL = 4
INTERVAL_FAMILIES = frozenset({"qwen3next"})  # families whose recurrent layers follow full_attention_interval


def recurrent_layers(path: os.PathLike[str] | str) -> tuple[bool, ...] | None:
    """Per layer, whether it is recurrent, for the families that mix the two by an interval;
    None for any other family. As llama.cpp decides it: `<arch>.attention.recurrent_layers`
    when the file lists them, else every layer but each `<arch>.full_attention_interval`-th
    (default 4)."""
    from ..native._gguf_header import read_header

    fields = read_header(path).fields
    arch = fields.get("general.architecture")
    if arch not in INTERVAL_FAMILIES:
        return None
    n_layer = int(fields.get(f"{arch}.block_count"))
    listed = fields.get(f"{arch}.attention.recurrent_layers")
    if listed is not None:
        flags = list(listed) if isinstance(listed, list) else [listed] * n_layer
        return tuple(bool(f) for f in flags[:n_layer])
    interval = fields.get(f"{arch}.full_attention_interval")
    interval = LLAMA_CPP_DEFAULT_INTERVAL if interval is None else int(interval)
    if interval < 1:
        raise SplitError(f"{arch}.full_attention_interval is {interval}: no layer would attend")
    return tuple((i + 1) % interval != 0 for i in range(n_layer))


def file_boundary_rule(path: os.PathLike[str] | str, arch: str) -> Callable[[int], bool]:
    """boundary_rule for the model in `path`, with its own recurrent layers."""
    return boundary_rule(arch, recurrent_layers=recurrent_layers(path))
