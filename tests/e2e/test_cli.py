"""``pgsub`` as a process: help, and ``peek`` against a real publisher."""

from pathlib import Path

import pytest

from tests.support.daemon import pgsub, write_config
from tests.support.pgdatabase import PgDatabase
from tests.support.streaming import create_slot

pytestmark = pytest.mark.e2e


def test_help_lists_the_commands() -> None:
    result = pgsub("--help")
    assert result.returncode == 0
    assert "peek" in result.stdout


def test_peek_prints_messages_and_leaves_the_slot(publisher: PgDatabase) -> None:
    publisher.execute(
        "CREATE TABLE t (a int PRIMARY KEY, b text); CREATE PUBLICATION p FOR TABLE t"
    )
    start = create_slot(publisher, "peeked")
    publisher.execute("INSERT INTO t VALUES (1, 'secret-free value')")
    result = pgsub("peek", "peeked", "--dsn", publisher.dsn, "-p", "p", "--limit", "4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ", 1)[1].split("(", 1)[0] for line in lines] == [
        "Begin",
        "Relation",
        "Insert",
        "Commit",
    ]
    assert publisher.confirmed_flush_lsn("peeked") == str(start)
    assert '"event": "replication started"' in result.stderr  # JSON logs, on stderr


def test_peek_without_dsn_is_a_usage_error() -> None:
    result = pgsub("peek", "s", "-p", "p", env={"PATH": "/usr/bin"})
    assert result.returncode == 2
    assert "PGSUB_DSN" in result.stderr


def test_peek_names_a_missing_slot(publisher: PgDatabase) -> None:
    publisher.execute("CREATE PUBLICATION p")
    result = pgsub("peek", "nosuchslot", "--dsn", publisher.dsn, "-p", "p")
    assert result.returncode == 1
    assert "nosuchslot" in result.stderr and "does not exist" in result.stderr


def test_publisher_setup_prints_or_installs_the_event_triggers(
    publisher: PgDatabase, tmp_path: Path
) -> None:
    printed = pgsub("publisher-setup", "--print")
    assert printed.returncode == 0 and "CREATE EVENT TRIGGER pgsub_ddl_after" in printed.stdout
    assert pgsub("publisher-setup", env={"PATH": "/usr/bin"}).returncode == 2  # which one?

    publisher.execute("CREATE TABLE t (a int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    config = tmp_path / "pgsub.yaml"
    write_config(config, publisher, tmp_path / "warehouse")
    installed = pgsub("publisher-setup", "-c", str(config), "sub1")
    assert installed.returncode == 0, installed.stderr
    triggers = publisher.fetchval(
        "SELECT string_agg(evtname, ',' ORDER BY evtname) FROM pg_event_trigger"
    )
    assert triggers == "pgsub_ddl_after,pgsub_ddl_before"

    # A user that may not create event triggers: the error says what to do.
    publisher.execute(
        "CREATE ROLE plain LOGIN REPLICATION; GRANT CREATE ON DATABASE "
        + publisher.fetchval("SELECT current_database()")
        + " TO plain"
    )
    write_config(
        config, publisher, tmp_path / "warehouse", connection=publisher.dsn + " user=plain"
    )
    refused = pgsub("publisher-setup", "-c", str(config), "sub1")
    assert refused.returncode == 1
    assert "superuser" in refused.stderr and "--print" in refused.stderr
