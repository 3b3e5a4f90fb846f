"""Structured logs: one JSON object per line on stderr, the access log included.

`logging_config(settings)` is a `logging.config.dictConfig` mapping that `gateway
serve` hands to uvicorn, so every worker process logs the same way: the gateway's
own loggers and uvicorn's error log as JSON (or plain text with `log_format: text`),
and uvicorn's access log off, since `gateway.access` writes a richer one (request
id, tenant, model, deployment, tokens, latency, error) for every request.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping

ACCESS_LOGGER = "gateway.access"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """A record as a line of text, its `fields` as key=value pairs after the message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            line += "".join(f" {key}={value}" for key, value in fields.items() if value is not None)
        return line


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
