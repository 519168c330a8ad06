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

REFUSED = 3  # the child's exit code when llama.cpp refused the file cleanly (no crash)

_CHILD = f"""
import sys
from loguru import logger
from skippy.errors import SkippyError  # importing skippy disables its logger: enable it after
from skippy.native import Batch, Context, ContextOptions, Model
logger.enable("skippy")
logger.remove()
logger.add(sys.stderr, level="ERROR", format="{{message}}")  # llama.cpp's own reason, one line each
try:
    with Model(sys.argv[1]) as model:
        with Context(model, ContextOptions(n_ctx=256, n_batch=8, n_ubatch=8, n_seq_max=1, threads=1)) as ctx:
            token = max(model.tokenizer.bos, 0)
            ctx.decode(Batch(1).set([token], [0], 0))
except SkippyError as exc:
    print(exc, file=sys.stderr)
    sys.exit({REFUSED})
"""


def probe_model(path: os.PathLike[str] | str, timeout: float = 120.0) -> None:
    """Raise ModelLoadError unless `path` loads and decodes in a separate process."""
    path = Path(path)
    check_gguf(path)  # the cheap structural checks first, with their precise messages
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # no debugger attached to a dying child
    env.pop("SKIPPY_TEST_FAULT", None)  # a test's injected faults are for the serving context, not this probe
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        raise ModelLoadError(f"{path}: loading it in a probe process did not finish in {timeout:.0f}s") from None
    if proc.returncode == 0:
        return
    if proc.returncode == REFUSED:  # a clean refusal: llama.cpp's reason, then ours
        reasons = [line.removeprefix("llama.cpp: ") for line in proc.stderr.strip().splitlines() if line.strip()]
        raise ModelLoadError(f"{path}: llama.cpp cannot load this file: {'; '.join(reasons[-3:])}")
    how = f"exit code {proc.returncode}"
    if proc.returncode < 0:
        how = f"killed by {signal.Signals(-proc.returncode).name}"
    detail = "\n".join(line for line in proc.stderr.strip().splitlines()[-5:])
    raise ModelLoadError(f"{path}: llama.cpp cannot load this file safely ({how} in a probe process):\n{detail}")
