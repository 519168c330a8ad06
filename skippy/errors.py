"""Named errors: every failure a caller can act on has its own class."""

from __future__ import annotations


class SkippyError(Exception):
    """Base of every error Skippy raises on purpose."""


# -- native substrate ---------------------------------------------------------


class NativeBuildError(SkippyError):
    """Fetching, patching or compiling llama.cpp failed."""


class PatchApplyError(NativeBuildError):
    """A patch in patches/ does not apply to the pinned source."""

    def __init__(self, patch: str, detail: str) -> None:
        super().__init__(f"patch {patch} does not apply to the pinned llama.cpp: {detail}")
        self.patch = patch


class NativeNotBuiltError(SkippyError):
    """The native library for this configuration has not been built yet."""


class ModelLoadError(SkippyError):
    """A model file is missing, truncated, not GGUF, or rejected by llama.cpp."""


class ModelFetchError(SkippyError):
    """A model could not be fetched or failed its checksum."""


class UnsupportedMemoryError(ModelLoadError):
    """llama.cpp builds a memory for this model that skippy cannot count (no KV memory at all, or a
    type the KV ledger does not describe); refused at load. `memory_type` is llama.cpp's C++ type."""

    def __init__(self, memory_type: str, arch: str, why: str) -> None:
        super().__init__(f"architecture {arch!r}: unsupported memory type {memory_type!r}: {why}")
        self.memory_type = memory_type
        self.arch = arch


class UnknownFamilyError(ModelLoadError, ValueError):
    """A synthetic model family that skippy.models.synth cannot write."""


class ClosedError(SkippyError):
    """A model or context was used after close()."""


class ContextError(SkippyError):
    """llama.cpp refused to create a context with these options."""


class InvalidInputError(SkippyError, ValueError):
    """An argument was rejected in Python before reaching C."""


class InvalidBatchError(InvalidInputError):
    """A batch was rejected before reaching C (bad token, seq id or position)."""


class DecodeError(SkippyError):
    """llama_decode failed; `code` is its return value."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message or f"llama_decode failed with code {code}")
        self.code = code


class NoKvSlotError(DecodeError):
    """llama_decode returned 1: the memory has no room for this batch."""


class DecodeAbortedError(DecodeError):
    """llama_decode returned 2: aborted by the abort callback."""


class StateError(SkippyError):
    """Saving or restoring a sequence's state failed."""


# -- scheduler / engine ---------------------------------------------------------


class OverloadedError(SkippyError):
    """The waiting queue is full: retry later (HTTP 429). Never a decode failure."""

    def __init__(self, waiting: int, limit: int) -> None:
        super().__init__(f"engine overloaded: {waiting} requests waiting (limit {limit}); retry later")
        self.waiting = waiting
        self.limit = limit


class LateRequestError(SkippyError):
    """Shed (`shed_late`): the request could no longer meet its first-token target when its turn came,
    so it was refused rather than served late (HTTP 429 with Retry-After). Nothing of it ran."""

    def __init__(self, request_id: int, waited_s: float, retry_after_s: float) -> None:
        super().__init__(f"request {request_id} shed: it waited {waited_s:.2f} s and can no longer meet its "
                         f"time-to-first-token target; retry in about {retry_after_s:.0f} s")
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s


class EmptyPromptError(InvalidInputError):
    """The prompt has no tokens."""


class PromptTooLongError(InvalidInputError):
    """prompt + max_tokens do not fit in the context a single sequence can use."""


class InvalidMaxTokensError(InvalidInputError):
    """max_tokens must be a positive integer."""


class SchedulerInvariantError(SkippyError):
    """The scheduler broke one of its own rules (a bug in Skippy, never the caller's input)."""


class StepFailedError(SkippyError):
    """The step carrying this request failed; only that step's requests see it."""


class EngineClosedError(SkippyError):
    """The engine was used after it shut down."""


class EngineBusyError(SkippyError):
    """Asked for what needs an idle engine (flushing the prefix cache) while requests run or wait."""


class StreamStateError(SkippyError, RuntimeError):
    """A GenerationStream asked for what its state does not allow (diverted twice, or after its end)."""


# -- staged serving ---------------------------------------------------------------


class StageUnavailableError(SkippyError):
    """A stage of the pipeline is unreachable or went away; requests it held are lost.
    The pipeline serves again once the stage is back (the next step reconnects)."""


class StageFailedError(SkippyError):
    """A stage answered a micro-batch with an error; `code` is the stage's (e.g. decode_failed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
