"""HTTP errors with OpenAI's body, and the status of each engine exception. Pure."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import (EngineClosedError, InvalidInputError, LateRequestError, OverloadedError, PromptTooLongError, SkippyError,
                      StageUnavailableError)

RETRY_AFTER_S = 1


class ApiError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def engine_error(exc: BaseException) -> ApiError:
    """The HTTP status of an engine exception raised at submission."""
    if isinstance(exc, OverloadedError):
        return ApiError(429, str(exc), type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, PromptTooLongError):
        return ApiError(400, str(exc), param="prompt", code="context_length_exceeded")
    if isinstance(exc, (InvalidInputError, ValueError)):  # generate() validates its arguments
        return ApiError(400, str(exc))
    if isinstance(exc, EngineClosedError):
        return shutting_down()
    if isinstance(exc, SkippyError):
        return ApiError(500, str(exc), type="server_error")
    return ApiError(500, "internal error", type="server_error")


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def generation_failed(error: BaseException | None) -> ApiError:
    """A request that failed after it was accepted. A lost pipeline stage is 503 + Retry-After:
    the server is fine and a retry is served once the stage is back; anything else is a 500."""
    if isinstance(error, LateRequestError):
        return ApiError(429, str(error), type="rate_limit_error", code="late_shed",
                        headers={"Retry-After": str(max(1, round(error.retry_after_s)))})
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, StageUnavailableError):
        cause = cause.__cause__
    if cause is not None:
        return ApiError(503, f"generation failed: {error}", type="server_error", code="stage_unavailable",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(500, f"generation failed: {error}", type="server_error", code="generation_failed")


def not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")


def unauthorized() -> ApiError:
    return ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
