"""Load an untrusted model in a child process first: some malformed GGUFs make llama.cpp abort
or segfault (an assert in a loader, a tensor a graph uses unconditionally), which no Python
check can catch in-process. The child loads the file, creates a small context and decodes one
token; if it dies, the caller gets a ModelLoadError and keeps running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import ModelLoadError
from ._gguf_check import check_gguf

_CHILD = """
import sys
from skippy.native import Batch, Context, ContextOptions, Model
with Model(sys.argv[1]) as model:
    with Context(model, ContextOptions(n_ctx=256, n_batch=8, n_ubatch=8, n_seq_max=1, threads=1)) as ctx:
        token = max(model.tokenizer.bos, 0)
        ctx.decode(Batch(1).set([token], [0], 0))
"""


def probe_model(path: os.PathLike[str] | str, timeout: float = 120.0) -> None:
    """Raise ModelLoadError unless `path` loads and decodes in a separate process."""
    path = Path(path)
    check_gguf(path)  # the cheap structural checks first, with their precise messages
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # no debugger attached to a dying child
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        raise ModelLoadError(f"{path}: loading it in a probe process did not finish in {timeout:.0f}s") from None
    if proc.returncode == 0:
        return
    how = f"exit code {proc.returncode}"
    if proc.returncode < 0:
        how = f"killed by {signal.Signals(-proc.returncode).name}"
    detail = "\n".join(line for line in proc.stderr.strip().splitlines()[-5:])
    raise ModelLoadError(f"{path}: llama.cpp cannot load this file safely ({how} in a probe process):\n{detail}")
