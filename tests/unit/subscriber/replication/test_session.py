"""One way to connect to a publisher (subscriber/replication/session.py)."""

from __future__ import annotations

import re
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from subscriber.replication.session import SETTINGS, with_session_options

ROOT = Path(__file__).resolve().parents[4]
PACKAGES = ("subscriber", "apply", "tablesync", "conflicts")
# Connections to a server the process itself started (the demo's throwaway publisher),
# made as its owner to create its tables, not to read values pgsub parses.
OWN_SERVERS = {"subscriber/runtime/embedded.py", "subscriber/runtime/demo.py"}


def test_our_settings_come_after_the_users_and_win() -> None:
    conninfo = with_session_options(
        "host=db dbname=app options='-c work_mem=64MB -c datestyle=SQL'"
    )
    params = conninfo_to_dict(conninfo)
    options = str(params["options"])
    assert options.startswith("-c work_mem=64MB -c datestyle=SQL ")
    for name, value in SETTINGS.items():
        assert f"-c {name}={value}" in options
    assert options.rindex("datestyle=ISO") > options.rindex("datestyle=SQL")
    assert params["client_encoding"] == "UTF8" and params["host"] == "db"


def test_every_publisher_connection_is_opened_by_the_session_factory() -> None:
    """A new module that calls psycopg.connect directly would read the server's defaults."""
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in OWN_SERVERS or relative == "subscriber/replication/session.py":
                continue
            if re.search(r"psycopg\.connect\(|Connection\.connect\(", path.read_text()):
                offenders.append(relative)
    assert offenders == [], "open publisher connections with subscriber.replication.session"
