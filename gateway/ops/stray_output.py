"""What would reach a serving process's stdout or stderr outside the logging module, made log records.

The libraries the gateway stands on are told not to print (LiteLLM's banners and verbose prints are
off, gateway/upstream/litellm_client/base.py; Python's warnings go through logging, gateway/ops/logs.py), but a library
may still `print()`, and Python itself writes some things straight to `sys.stderr`: an exception a
`__del__` or a callback ignored ("Exception ignored in ..."), one that ended a thread, one that ends
the process. So while serving:

* those three hooks log the exception as one record (logger `python`) with its traceback;
* `sys.stdout` and `sys.stderr` are `LinesToLog`: what is written to them becomes a warning record
  of the logger `stray.stdout` or `stray.stderr` as each write ends a line (a `print()` of several
  lines is one record), colours taken out, blank lines dropped. The log handler writes to the stream
  underneath (`underlying`).

Only what goes through Python's streams is seen: a C library writing to file descriptor 2 is not.
"""
from __future__ import annotations

import io
import logging
import re
import sys
import threading
from types import TracebackType
from typing import Any, TextIO

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_MOST_PENDING = 64 * 1024  # a text written without an end of line is logged once this long
log = logging.getLogger("python")


class LinesToLog(io.TextIOBase):
    """A text stream whose lines are logged to `logger` at warning (each thread's apart)."""

    def __init__(self, underlying: TextIO, logger: str) -> None:
        super().__init__()
        self.underlying = underlying
        self._log = logging.getLogger(logger)
        self._local = threading.local()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.underlying, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.underlying, "errors", None)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # nobody colours what becomes a record

    def fileno(self) -> int:
        return self.underlying.fileno()

    def write(self, text: str) -> int:
        if getattr(self._local, "logging", False):  # a handler's own trouble, told while logging a line
            return self.underlying.write(text)
        pending = getattr(self._local, "pending", "") + text
        if pending.endswith("\n") or len(pending) > _MOST_PENDING:  # what one print() wrote, its lines together
            self._local.pending = ""
            self._emit(pending)
        else:
            self._local.pending = pending
        return len(text)

    def flush(self) -> None:
        self.underlying.flush()

    def close(self) -> None:
        rest = getattr(self._local, "pending", "")
        self._local.pending = ""
        self._emit(rest)

    def _emit(self, text: str) -> None:
        text = _ANSI.sub("", text).strip("\n").rstrip()
        if not text.strip():
            return
        self._local.logging = True
        try:
            self._log.warning("%s", text)
        finally:
            self._local.logging = False


def _unraisable(unraisable: Any) -> None:
    try:
        what = f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}"
    except Exception:  # the object's own repr fails
        what = unraisable.err_msg or "Exception ignored"
    log.warning("%s", what, exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))


def _thread_ended(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    log.error("exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _uncaught(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
    log.critical("uncaught exception", exc_info=(kind, value, traceback))


def route_strays() -> None:
    """Install the hooks and the two streams (once per process)."""
    sys.unraisablehook = _unraisable
    threading.excepthook = _thread_ended
    sys.excepthook = _uncaught
    if not isinstance(sys.stdout, LinesToLog) and sys.stdout is not None:
        sys.stdout = LinesToLog(sys.stdout, "stray.stdout")
    if not isinstance(sys.stderr, LinesToLog) and sys.stderr is not None:
        sys.stderr = LinesToLog(sys.stderr, "stray.stderr")
