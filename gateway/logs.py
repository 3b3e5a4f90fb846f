"""Structured logs: one JSON object per line on stderr, the access log included.

`logging_config(settings)` is a `logging.config.dictConfig` mapping that `gateway
serve` hands to uvicorn, so every worker process logs the same way: the gateway's
own loggers and uvicorn's error log as JSON (or plain text with `log_format: text`),
and uvicorn's access log off, since `gateway.access` writes a richer one (request
id, tenant, model, deployment, tokens, latency, error) for every request.

No line passes `MAX_LINE` characters (about 10 KB): a message, an exception or a field longer than
its share keeps its head and its tail around a note of what was cut. A database error's text holds
its statement (the engines hide its parameters, storage/database.py), which no longer grows with a
request, but a line is bounded whatever a foreign error carries.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping

ACCESS_LOGGER = "gateway.access"
MAX_LINE = 10_000
_MESSAGE_SHARE, _EXCEPTION_SHARE, _FIELD_SHARE = 2_000, 6_000, 500


def cut(text: str, most: int) -> str:
    """`text`, or its head and tail around a note of how much was cut when it passes `most` characters."""
    if len(text) <= most:
        return text
    note = f" ...[{len(text) - most} characters cut]... "
    keep = max(0, most - len(note))
    return text[:keep // 3] + note + text[len(text) - (keep - keep // 3):]


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": cut(record.getMessage(), _MESSAGE_SHARE),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            out.update((key, _short(value)) for key, value in fields.items())
        if record.exc_info:
            out["exception"] = cut(self.formatException(record.exc_info), _EXCEPTION_SHARE)
        line = json.dumps(out, ensure_ascii=False, default=str, separators=(",", ":"))
        if len(line) <= MAX_LINE:
            return line
        return json.dumps({key: out[key] for key in ("ts", "level", "logger", "message")}  # many fields
                          | {"cut": f"{len(line)} characters"}, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """A record as a line of text, its `fields` as key=value pairs after the message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)  # the message and its exception's traceback
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            line += "".join(f" {key}={_short(value)}" for key, value in fields.items() if value is not None)
        return cut(line, MAX_LINE)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = cut(record.message, _MESSAGE_SHARE)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return cut(super().formatException(ei), _EXCEPTION_SHARE)


def _short(value: Any) -> Any:
    """A field's value, a string cut to its share."""
    return cut(value, _FIELD_SHARE) if isinstance(value, str) else value


def logging_config(level: str, log_format: str, access_log: bool = True) -> dict[str, Any]:
    """The dictConfig for `gateway serve` (and uvicorn's workers)."""
    formatter = "gateway.logs.JsonFormatter" if log_format == "json" else "gateway.logs.TextFormatter"
    handler = {"class": "logging.StreamHandler", "formatter": "gateway", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": formatter}},
        "handlers": {"stderr": handler},
        "loggers": {
            "gateway": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            # access lines are at info: `log_level: warning` silences them too, as it does uvicorn's
            ACCESS_LOGGER: {"handlers": ["stderr"], "level": "CRITICAL" if not access_log else
                            "INFO" if level in ("debug", "info") else level.upper(), "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
        },
    }
