"""origin: none against a real multi-origin setup: a native subscription feeds the publisher.

An upstream cluster publishes ``t``; the publisher subscribes to it with
PostgreSQL's own subscriber, so its ``t`` holds upstream rows (applied under a
replication origin) and its own local writes. pgsub with ``origin: none``
must apply only the local ones, as PostgreSQL's subscriber does (publisher
16+); with ``origin: any`` everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pgcluster import PgCluster, wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE t (id int PRIMARY KEY, src text, n int DEFAULT 0)"


@pytest.fixture
def fed_publisher(
    publisher_any: PgDatabase, pg_cluster: Callable[..., PgCluster]
) -> Iterator[tuple[PgDatabase, PgDatabase]]:
    """(publisher, upstream): the publisher's ``t`` is fed by a native subscription."""
    publisher = publisher_any
    if publisher.major < 16:
        pytest.skip("origin needs PostgreSQL 16 on the publisher")
    upstream = PgDatabase.create(pg_cluster(), "up")
    upstream.execute(f"{TABLE}; CREATE PUBLICATION up FOR TABLE t")
    publisher.execute(f"{TABLE}; CREATE PUBLICATION pub FOR TABLE t")
    publisher.execute(
        f"CREATE SUBSCRIPTION feed CONNECTION '{upstream.dsn}' PUBLICATION up"
        " WITH (copy_data = false)"
    )
    try:
        yield publisher, upstream
    finally:
        # While the upstream still runs, so that its slot goes with the subscription.
        publisher.execute("DROP SUBSCRIPTION feed")
        upstream.drop()


def rows(db: PgDatabase, where: str = "true") -> list[tuple[Any, ...]]:
    return sorted(db.fetch(f"SELECT id, src, n FROM t WHERE {where}"))


def write_both(publisher: PgDatabase, upstream: PgDatabase) -> None:
    upstream.execute("INSERT INTO t SELECT g, 'upstream', 0 FROM generate_series(1, 50) g")
    publisher.execute("INSERT INTO t SELECT g, 'local', 0 FROM generate_series(1001, 1050) g")
    upstream.execute("UPDATE t SET n = 1 WHERE id <= 10")
    publisher.execute("UPDATE t SET n = 2 WHERE id BETWEEN 1001 AND 1010")
    publisher.execute("DELETE FROM t WHERE id > 1040")
    wait_until(
        lambda: (
            len(rows(publisher, "src = 'upstream'")) == 50 and len(rows(publisher, "n = 1")) == 10
        ),
        timeout=60,
        what="the native subscription to bring the upstream rows",
    )
    # A local change of a row that came from upstream is a local change: with
    # origin none it arrives for a row the target never got (update_missing).
    publisher.execute("UPDATE t SET n = 3 WHERE id = 20")


def delta_rows(rep: Replication) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["src"], r["n"]) for r in rep.rows("public.t"))


@pytest.mark.parametrize("origin", ["none", "any"])
def test_origin_none_applies_only_the_publishers_own_writes(
    fed_publisher: tuple[PgDatabase, PgDatabase], spark: Any, warehouse: Path, origin: str
) -> None:
    """With ``any`` (the default) the upstream rows arrive too: the filter is what differs."""
    publisher, upstream = fed_publisher
    with Replication(publisher, spark, warehouse, origin=origin) as rep:
        write_both(publisher, upstream)
        rep.caught_up()
        if origin == "any":
            assert delta_rows(rep) == rows(publisher) and len(delta_rows(rep)) == 90
            return
        assert delta_rows(rep) == rows(publisher, "src = 'local'")
        assert len(delta_rows(rep)) == 40
        missing = rep.metrics.registry.get_sample_value(
            "pgsub_conflicts_total",
            {"subscription": "sub1", "relation": "public.t", "type": "update_missing"},
        )
        assert missing == 1
