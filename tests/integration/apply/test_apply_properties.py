"""Property on the real pipeline: random DML, random batch bounds, the publisher's tables."""

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

_runs = itertools.count(1)

STATEMENT = st.sampled_from(
    [
        "INSERT INTO k SELECT g, md5(g::text), 0 FROM generate_series({a}, {a} + {n}) g"
        " ON CONFLICT (id) DO UPDATE SET n = k.n + 1",
        "UPDATE k SET v = v || 'x', n = n + 1 WHERE id % {m} = 0",
        # Moves rows to new keys; only onto keys that are free (the workload must be valid SQL).
        "UPDATE k SET id = id + 1000 WHERE id BETWEEN {a} AND {a} + 2 AND id < 1000"
        " AND id + 1000 NOT IN (SELECT id FROM k)",
        "DELETE FROM k WHERE id % {m} = 1",
        "INSERT INTO f SELECT g % 3, 'r' FROM generate_series(1, {n}) g",
        "DELETE FROM f WHERE ctid IN (SELECT ctid FROM f WHERE a = {m} % 3 LIMIT 2)",
        "UPDATE f SET b = b || 'u' WHERE ctid IN (SELECT ctid FROM f LIMIT 1)",
        "TRUNCATE f",
    ]
)
TRANSACTION = st.lists(
    st.builds(
        lambda text, a, n, m: text.format(a=a, n=n, m=m),
        STATEMENT,
        st.integers(1, 40),
        st.integers(0, 15),
        st.integers(2, 5),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=4,
    deadline=None,
    # Each example runs a real subscription: shrinking would take longer than the suite.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    transactions=st.lists(TRANSACTION, min_size=1, max_size=12),
    max_changes=st.sampled_from([1, 7, 50, 100_000]),
)
def test_random_dml_with_random_batches(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    transactions: list[list[str]],
    max_changes: int,
) -> None:
    run = next(_runs)
    publisher.execute(
        "CREATE TABLE IF NOT EXISTS k (id int PRIMARY KEY, v text, n int);"
        "CREATE TABLE IF NOT EXISTS f (a int, b text);"
        "ALTER TABLE f REPLICA IDENTITY FULL; TRUNCATE k, f;"
        "DROP PUBLICATION IF EXISTS pub; CREATE PUBLICATION pub FOR TABLE k, f"
    )
    warehouse = tmp_path / f"warehouse{run}"
    settings_: dict[str, Any] = {"batch": {"max_changes": max_changes, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, name=f"prop{run}", **settings_) as rep:
        for statements in transactions:
            publisher.execute("BEGIN;" + ";".join(statements) + ";COMMIT")
        # max_changes 1 applies a transaction one change at a time, and a piece of the
        # multiset table is a Spark MERGE (1.5-2 s beside the other test process): twelve
        # transactions of up to 15 changes took 140 s on this machine. The test is of rows.
        rep.caught_up(timeout=600)
        rep.assert_equal("public.k", key=("id",))
        rep.assert_equal("public.f")
