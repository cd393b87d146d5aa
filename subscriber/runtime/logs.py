"""Log configuration: structlog events on stderr, JSON unless a person is watching.

JSON by default, the console renderer on a TTY. Events
never carry row values (except conflict events) and never secrets.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import partial
from typing import Literal

import structlog

LogFormat = Literal["json", "console", "auto"]


_CONFIGURED: list[tuple[LogFormat, str]] = []


def configured() -> Callable[[], None]:
    """The last ``configure`` as a picklable call: what a writer process runs first."""
    format, level = _CONFIGURED[-1] if _CONFIGURED else ("auto", "info")
    return partial(configure, format, level)


def configure(format: LogFormat = "auto", level: str = "info") -> None:
    _CONFIGURED.append((format, level))
    del _CONFIGURED[:-1]
    renderer: structlog.typing.Processor
    use_console = format == "console" or (format == "auto" and sys.stderr.isatty())
    if use_console:
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries log through the standard library: their warnings and errors become events
    # of the same stream, not bare tracebacks. py4j logs a lost JVM connection (on the root
    # logger) before raising it; pgsub reports the error it raises, with its context.
    root = logging.getLogger()
    root.handlers = [_LibraryEvents(debug=level == "debug")]
    root.setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


class _LibraryEvents(logging.Handler):
    """A library's log record as a structlog event: its message, its logger, the exception's
    type and text (the traceback only at level debug)."""

    def __init__(self, *, debug: bool) -> None:
        super().__init__()
        self._debug = debug

    def emit(self, record: logging.LogRecord) -> None:
        if not self._debug and record.exc_info and record.getMessage().startswith(_PY4J_LOST):
            return
        fields: dict[str, object] = {"logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            fields["error"] = f"{type(error).__name__}: {error}"
            if self._debug:
                fields["exc_info"] = record.exc_info
        structlog.get_logger("library").log(record.levelno, record.getMessage(), **fields)


_PY4J_LOST = "Exception while sending command"
