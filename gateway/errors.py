"""The gateway's error tree, rendered in OpenAI's error shape by one handler.

    GatewayError (500 api_error)
    ├── InvalidRequest (400 invalid_request_error)
    │   └── ContextBudgetExceeded (400, code context_budget_exceeded)
    ├── AuthenticationFailed (401 authentication_error)
    ├── PermissionDenied (403 permission_error)
    ├── NotFound (404 invalid_request_error)
    │   └── ModelNotFound (404, code model_not_found)
    ├── RequestTimeout (408 invalid_request_error: a request body that did not arrive in time)
    ├── RateLimitExceeded (429 rate_limit_error: the tenant's or key's limit here)
    │   └── BudgetExceeded (429 insufficient_quota, code budget_exceeded: a spend budget here)
    ├── ServiceUnavailable (503, Retry-After: the database, Redis under `redis.when_down: refuse`, or
    │                       the process full: connections, request bytes in memory)
    └── UpstreamError (the upstream's status)
        ├── UpstreamRateLimited (429 rate_limit_error)
        ├── UpstreamTimeout (504 timeout)
        ├── UpstreamUnavailable (502 api_error)
        └── UpstreamInvalidResponse (502, code upstream_error: a 200 that is no completion)

Core code raises these; foreign errors (LiteLLM, SQLAlchemy) are mapped once,
where they enter, with `raise ... from exc`.
"""
from __future__ import annotations

from typing import Any, Mapping


class GatewayError(Exception):
    status_code = 500
    error_type = "api_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status_code: int | None = None,
        headers: Mapping[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail  # for the run's record only, never sent to the client
        self.param = param
        self.code = code or self.default_code
        if status_code is not None:
            self.status_code = status_code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextBudgetExceeded(InvalidRequest):
    default_code = "context_budget_exceeded"


class AuthenticationFailed(GatewayError):
    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class NotFound(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class RequestTimeout(GatewayError):
    """The client did not send its request body in time (server.body_timeout_seconds)."""

    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class RateLimitExceeded(GatewayError):
    """The tenant's own limit in this gateway (not the provider's)."""

    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class BudgetExceeded(RateLimitExceeded):
    """A key's or tenant's USD budget for the day or month is spent (OpenAI's type for a spent quota)."""

    error_type = "insufficient_quota"
    default_code = "budget_exceeded"


class ServiceUnavailable(GatewayError):
    """Something the gateway stands on (its database; Redis, under `redis.when_down: refuse`) is down, or
    this process holds as much as it may (connections, request bytes)."""

    status_code = 503
    default_code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: int = 2, **kwargs: Any) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)}, **kwargs)


class UpstreamError(GatewayError):
    """The provider answered with an error, or could not be reached."""

    error_type = "api_error"
    default_code = "upstream_error"


class UpstreamRateLimited(UpstreamError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class UpstreamTimeout(UpstreamError):
    status_code = 504
    error_type = "timeout"
    default_code = "upstream_timeout"


class UpstreamUnavailable(UpstreamError):
    status_code = 502
    default_code = "upstream_unavailable"


class UpstreamInvalidResponse(UpstreamError):
    """The provider answered 200 with something that is not a completion (garbage, HTML, no choices)."""

    status_code = 502


class InternalError(GatewayError):
    """A fault of the gateway itself: answered 500, recorded as `internal_error` with the exception type."""

    default_code = "internal_error"


def key_unavailable(what: str, error: Exception) -> GatewayError:
    """A stored record sealed under a key this gateway was not given: its configuration's fault, said plainly."""
    key_id = getattr(error, "key_id", "?")
    return GatewayError(f"{what} is encrypted under key {key_id}, which this gateway was not given "
                        "(storage.encryption_key or storage.decryption_keys).", code="encryption_key_unavailable")


def upstream_error_for_status(status: int, message: str, headers: Mapping[str, str] | None = None) -> UpstreamError:
    """The error to give the client for an upstream HTTP status."""
    if status == 429:
        return UpstreamRateLimited(message, headers=headers)
    if status in (408, 504):
        return UpstreamTimeout(message, headers=headers)
    error = UpstreamError(message, status_code=status if 400 <= status <= 599 else 502, headers=headers)
    if status == 401:
        error.error_type, error.code = "authentication_error", "upstream_authentication_failed"
    elif status == 403:
        error.error_type, error.code = "permission_error", "upstream_permission_denied"
    elif status == 404:
        error.error_type, error.code = "invalid_request_error", "upstream_not_found"
    elif 400 <= status < 500:
        error.error_type, error.code = "invalid_request_error", "upstream_rejected_request"
    return error
