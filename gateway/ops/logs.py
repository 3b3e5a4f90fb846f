"""Structured logs: one JSON object per line on stderr, whoever writes it.

`logging_config(...)` is a `logging.config.dictConfig` mapping that `gateway serve` hands to uvicorn,
so every worker process logs the same way: one handler on the root logger, JSON (or plain text with
`log_format: text`). The gateway's loggers and uvicorn's speak at `log_level`; LiteLLM's ("LiteLLM",
"LiteLLM Router", "LiteLLM Proxy", whose own coloured handler gateway/upstream/litellm_client/base.py takes away) at
`log_level: debug`, else at warning and above like every other library (and Python's warnings,
`captureWarnings`): its info lines repeat, once per call, what the access line says. uvicorn's access
log is off, since `gateway.access` writes a richer one (request id, tenant, model, deployment, tokens,
latency, error code) for every request. `serve_logging` also turns what would reach stdout or stderr
outside the logging module into records (gateway/ops/stray_output.py).

Every record logged while a request is served carries its request id, and its tenant and error code
once they are known (`RequestFields`, from the context the request-id middleware opens): the lines of
LiteLLM, uvicorn and the warnings module included, and exceptions' too.

No line passes `MAX_LINE` characters (about 10 KB): a message, an exception or a field longer than
its share keeps its head and its tail around a note of what was cut. A database error's text holds
its statement (the engines hide its parameters, storage/database.py), which no longer grows with a
request, but a line is bounded whatever a foreign error carries.
"""
from __future__ import annotations

import json
import logging
import logging.config
import sys
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Mapping

ACCESS_LOGGER = "gateway.access"
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
MAX_LINE = 10_000
_MESSAGE_SHARE, _EXCEPTION_SHARE, _FIELD_SHARE = 2_000, 6_000, 500


@dataclass
class RequestContext:
    """What every line logged while one request is served says of it (the request-id middleware opens
    it; authentication names the tenant, the error handlers the code of a refusal)."""

    request_id: str
    tenant: str | None = None
    code: str | None = None

    def fields(self) -> dict[str, str]:
        found = {"request_id": self.request_id, "tenant": self.tenant, "code": self.code}
        return {key: value for key, value in found.items() if value is not None}


_request: ContextVar[RequestContext | None] = ContextVar("gateway_request", default=None)


def open_request(request_id: str) -> tuple[RequestContext, Token[RequestContext | None]]:
    """The context of a request now being served (worker threads and tasks it starts see it too)."""
    context = RequestContext(request_id)
    return context, _request.set(context)


def close_request(token: Token[RequestContext | None]) -> None:
    _request.reset(token)


def note_tenant(tenant: str | None) -> None:
    """The tenant the request speaks for, once its key is known."""
    context = _request.get()
    if context is not None and tenant is not None:
        context.tenant = tenant


def note_refusal(code: str) -> None:
    """The gateway error code the request is answered with."""
    context = _request.get()
    if context is not None:
        context.code = code


class RequestFields(logging.Filter):
    """Gives each record the request it was logged in (`request_id`, `tenant`, `code`), whoever logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _request.get()
        if context is not None:
            record.gateway_request = context.fields()
        return True


def cut(text: str, most: int) -> str:
    """`text`, or its head and tail around a note of how much was cut when it passes `most` characters."""
    if len(text) <= most:
        return text
    note = f" ...[{len(text) - most} characters cut]... "
    keep = max(0, most - len(note))
    return text[:keep // 3] + note + text[len(text) - (keep - keep // 3):]


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The request's fields, then the record's own `fields` (which win, unless they say None)."""
    out: dict[str, Any] = dict(getattr(record, "gateway_request", None) or {})
    fields = getattr(record, "fields", None)
    if isinstance(fields, Mapping):
        out.update((key, _short(value)) for key, value in fields.items() if value is not None or key not in out)
    return out


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, the request's fields and the record's
    `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": cut(record.getMessage().strip(), _MESSAGE_SHARE),  # LiteLLM's start with a newline
        }
        out.update(_record_fields(record))
        if record.exc_info:
            out["exception"] = cut(self.formatException(record.exc_info), _EXCEPTION_SHARE)
        line = json.dumps(out, ensure_ascii=False, default=str, separators=(",", ":"))
        if len(line) <= MAX_LINE:
            return line
        kept = ("ts", "level", "logger", "message", "request_id", "tenant", "code")
        return json.dumps({key: out[key] for key in kept if key in out}  # many fields
                          | {"cut": f"{len(line)} characters"}, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """A record as a line of text: time, level, logger, the request id when there is one, the message,
    then the other fields (the request's tenant and code, the record's `fields`) as key=value pairs."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = _record_fields(record)
        request_id = fields.pop("request_id", None)
        record.request_tag = f" {request_id}" if request_id else ""
        line = super().format(record)  # the message and its exception's traceback
        line += "".join(f" {key}={value}" for key, value in fields.items() if value is not None)
        return cut(line, MAX_LINE)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = cut(record.message.strip(), _MESSAGE_SHARE)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return cut(super().formatException(ei), _EXCEPTION_SHARE)


def _short(value: Any) -> Any:
    """A field's value, a string cut to its share."""
    return cut(value, _FIELD_SHARE) if isinstance(value, str) else value


def stderr_handler() -> logging.StreamHandler:
    """The handler every line goes through: on the process's stderr, never on what gateway/ops/stray_output.py
    put in its place (uvicorn applies the config again once that is there)."""
    return logging.StreamHandler(getattr(sys.stderr, "underlying", sys.stderr))


def logging_config(level: str, log_format: str, access_log: bool = True) -> dict[str, Any]:
    """The dictConfig for `gateway serve` (and uvicorn's workers)."""
    formatter = "gateway.ops.logs.JsonFormatter" if log_format == "json" else "gateway.ops.logs.TextFormatter"
    ours = level.upper()
    others = max(logging.WARNING, logging.getLevelName(ours))  # other libraries: warnings and errors
    handler = {"()": "gateway.ops.logs.stderr_handler", "formatter": "gateway", "filters": ["request"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": formatter}},
        "filters": {"request": {"()": "gateway.ops.logs.RequestFields"}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": logging.getLevelName(others)},
        "loggers": {
            "gateway": {"level": ours},
            # access lines are at info: `log_level: warning` silences them too, as it does uvicorn's
            ACCESS_LOGGER: {"level": "CRITICAL" if not access_log else "INFO" if level in ("debug", "info") else ours},
            "uvicorn": {"level": ours},
            "uvicorn.error": {"level": ours},
            "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
            **{name: {"handlers": [], "level": ours if ours == "DEBUG" else logging.getLevelName(others),
                      "propagate": True} for name in LITELLM_LOGGERS},
        },
    }


def serve_logging(level: str, log_format: str, access_log: bool = True) -> None:
    """Logging for a process that serves (`gateway serve`, and each of its `--workers`): the config
    above, Python's warnings as records, and what bypasses the logging module made records too."""
    from gateway.ops.stray_output import route_strays

    logging.config.dictConfig(logging_config(level, log_format, access_log))
    logging.captureWarnings(True)
    route_strays()


def hand_over(names: tuple[str, ...]) -> None:
    """Take away the handlers a library put on its own loggers, so their records reach the root's (ours)."""
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
