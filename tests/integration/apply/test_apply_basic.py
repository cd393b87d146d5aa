"""The leader applies DML in commit order into Delta: oracle equality after each scenario."""

from pathlib import Path
from typing import Any

import pytest

from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def test_inserts_updates_deletes_and_key_changes(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2));"
        "CREATE TABLE u (a bigint, b text, PRIMARY KEY (a, b));"
        "CREATE PUBLICATION pub FOR TABLE t, u"
    )
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute(
            "INSERT INTO t SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, 50) g;"
            "INSERT INTO u VALUES (1, 'x'), (2, 'y')"
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
        rep.assert_equal("public.u")
        publisher.execute(
            "BEGIN;"
            "UPDATE t SET v = 'changed' WHERE id <= 10;"
            "DELETE FROM t WHERE id BETWEEN 40 AND 45;"
            "UPDATE t SET id = id + 1000 WHERE id = 20;"  # key change
            "INSERT INTO u VALUES (3, 'z');"
            "UPDATE u SET b = 'w' WHERE a = 1;"  # key change of a composite key
            "COMMIT;"
            "INSERT INTO t VALUES (45, 'again', 0);"  # a deleted key comes back
            "BEGIN; COMMIT;"  # an empty transaction
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
        rep.assert_equal("public.u")
        metrics = rep.metrics.registry
        applied = metrics.get_sample_value(
            "pgsub_transactions_applied_total", {"subscription": "sub1"}
        )
        assert applied == 3  # PostgreSQL 15+ does not send empty transactions
