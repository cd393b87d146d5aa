"""Log configuration: structlog events on stderr, JSON unless a person is watching.

JSON by default, the console renderer on a TTY. Events
never carry row values (except conflict events) and never secrets.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["json", "console", "auto"]


def configure(format: LogFormat = "auto", level: str = "info") -> None:
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
