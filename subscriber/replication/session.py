"""Every connection pgsub opens to a publisher, with the session settings its parsers rely on.

The apply side reads values in the publisher's text forms (the stream, the
initial copy, ranged copies on threads or Spark executors, the text of a
binary value the publisher renders) and parses them as fixed forms: ISO dates,
UTC offsets, PostgreSQL-style intervals, shortest-exact floats, hex bytea,
UTF-8. A publisher whose defaults differ (``DateStyle = 'SQL, DMY'``,
``bytea_output = escape``, ``TimeZone = 'America/New_York'``, ...) must not
change what pgsub reads, so no connection takes the server's defaults:
``connect`` is the one way to open one, replication or not (a test checks
that no other module calls ``psycopg.connect``). PostgreSQL's own
walreceiver sets the first three settings the same way.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The settings, each as the server's ``-c name=value`` option (in ``options``).
SETTINGS: Final[dict[str, str]] = {
    "datestyle": "ISO",
    "intervalstyle": "postgres",
    "extra_float_digits": "3",
    "timezone": "UTC",
    "bytea_output": "hex",
}
SESSION_OPTIONS: Final = " ".join(f"-c {name}={value}" for name, value in SETTINGS.items())


def with_session_options(conninfo: str) -> str:
    """``conninfo`` with pgsub's session settings appended to any ``options`` it has (ours
    come last, so they win over the user's and the server's)."""
    params = conninfo_to_dict(conninfo)
    current = params.get("options")
    params["options"] = f"{current} {SESSION_OPTIONS}" if current else SESSION_OPTIONS
    params["client_encoding"] = "UTF8"
    return make_conninfo("", **params)


def connect(
    conninfo: str,
    *,
    replication: bool = False,
    connect_timeout: int = 30,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """An autocommit connection to the publisher with pgsub's session settings;
    ``replication``: a ``replication=database`` (walsender) connection."""
    if replication:
        kwargs["replication"] = "database"
        kwargs.setdefault("prepare_threshold", None)
    return psycopg.connect(
        with_session_options(conninfo),
        autocommit=True,
        connect_timeout=connect_timeout,
        **kwargs,
    )
