"""Load the compiled extension (never builds, never touches the network) and route llama.cpp's log."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import threading
from types import ModuleType
from typing import Any

from loguru import logger

from ..errors import NativeNotBuiltError
from ._build import EXT_MODULE, BuildFlags, _complete, locate

_lock = threading.Lock()
_module: ModuleType | None = None

# ggml log levels -> loguru levels; CONT continues the previous message
_LEVELS = {1: "DEBUG", 2: "INFO", 3: "WARNING", 4: "ERROR"}
_LEVEL_RANK = {"DEBUG": 1, "INFO": 2, "WARNING": 3, "ERROR": 4}


def _threshold() -> int:
    """llama.cpp is chatty at INFO; forward WARNING and up unless SKIPPY_LLAMA_LOG says otherwise."""
    name = os.environ.get("SKIPPY_LLAMA_LOG", "WARNING").upper()
    return _LEVEL_RANK.get(name, 3)


def load(flags: BuildFlags | None = None) -> tuple[Any, Any]:
    """Return (ffi, lib) of the extension built for these flags and the current patches."""
    global _module
    with _lock:
        if _module is None:
            _module = _import(flags)
            _module.lib.llama_backend_init()
            _install_log(_module)
        return _module.ffi, _module.lib


def _import(flags: BuildFlags | None) -> ModuleType:
    build = locate(flags)
    if not _complete(build, tools=False):
        raise NativeNotBuiltError(
            f"the native library for this configuration is not built ({build.root}); run `skippy build`"
        )
    candidates = sorted(build.ext_dir.glob(f"{EXT_MODULE}*.so"))
    if not candidates:
        raise NativeNotBuiltError(f"no compiled {EXT_MODULE} in {build.ext_dir}; run `skippy build`")
    loader = importlib.machinery.ExtensionFileLoader(EXT_MODULE, str(candidates[0]))
    spec = importlib.util.spec_from_file_location(EXT_MODULE, candidates[0], loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


_EXPECTED_UNUSED = "model has unused tensor"


class _LogRouter:
    """Joins llama.cpp's line fragments and hands whole lines to loguru."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.level = 2
        self.buffer = ""

    def feed(self, level: int, text: str) -> None:
        if level != 5:  # not GGML_LOG_LEVEL_CONT: a new message starts
            self.level = level
        if self.level < self.threshold:
            return
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            if line.strip():
                level = _LEVELS.get(self.level, "INFO")
                if line.startswith(_EXPECTED_UNUSED):  # a stage skips the other stages' layers (patch 0006)
                    level = "DEBUG"
                logger.opt(depth=0).log(level, "llama.cpp: {}", line)


def _install_log(module: ModuleType) -> None:
    router = _LogRouter(_threshold())
    ffi = module.ffi

    @ffi.def_extern()
    def skippy_log_callback(level, text, user_data):  # noqa: ARG001 - C signature
        try:
            router.feed(int(level), ffi.string(text).decode("utf-8", "replace"))
        except Exception:  # a log line must never raise into C
            pass

    module.lib.llama_log_set(module.lib.skippy_log_callback, ffi.NULL)
