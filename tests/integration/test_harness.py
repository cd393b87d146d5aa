"""The fixtures later tests rely on do what they say, against real servers."""

import pytest

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.integration


def test_publisher_is_ready_for_logical_replication(publisher_any: PgDatabase) -> None:
    settings = dict(
        publisher_any.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('wal_level', 'max_prepared_transactions', 'max_replication_slots')"
        )
    )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_prepared_transactions"]) > 0
    assert int(settings["max_replication_slots"]) >= 10
    version = int(publisher_any.fetchval("SHOW server_version_num"))
    assert version // 10000 == publisher_any.major


def test_server_does_not_run_as_root(publisher: PgDatabase) -> None:
    assert publisher.fetchval("SELECT current_setting('data_directory')")
    owner = publisher.cluster.datadir.stat().st_uid
    assert owner != 0


def test_database_setting_reaches_walsender_sessions(publisher: PgDatabase) -> None:
    publisher.set_config("logical_decoding_work_mem", "64kB")
    assert publisher.fetchval("SHOW logical_decoding_work_mem") == "64kB"


def test_native_subscriber_replicates_from_publisher(
    publisher: PgDatabase, native_subscriber: PgDatabase
) -> None:
    ddl = "CREATE TABLE t (id int PRIMARY KEY, v text)"
    publisher.execute(ddl)
    publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    publisher.execute("CREATE PUBLICATION p FOR TABLE t")
    native_subscriber.execute(ddl)
    native_subscriber.execute(f"CREATE SUBSCRIPTION s CONNECTION '{publisher.dsn}' PUBLICATION p")
    publisher.execute("UPDATE t SET v = 'changed' WHERE id <= 10")

    def caught_up() -> bool:
        return native_subscriber.fetch("SELECT * FROM t ORDER BY id") == publisher.fetch(
            "SELECT * FROM t ORDER BY id"
        )

    wait_until(caught_up, timeout=60, what="the native subscriber to catch up")
    assert native_subscriber.fetchval("SELECT count(*) FROM t WHERE v = 'changed'") == 10
