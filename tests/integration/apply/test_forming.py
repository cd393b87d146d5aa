"""Batches formed while the batch before is written (``apply.batching.forming``), against a real
publisher and real Delta tables."""

from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE keyed (id int PRIMARY KEY, v text, n int);
CREATE TABLE other (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, other, bag;
"""


def one_change(conn: psycopg.Connection[Any], n: int) -> None:
    """A single-row transaction: updates, inserts, deletes and key changes over three tables."""
    key = n * 7919 % 500 + 1
    kind = n % 10
    if kind < 5:
        conn.execute("UPDATE keyed SET v = %s, n = n + 1 WHERE id = %s", [f"u{n}", key])
    elif kind == 5:
        conn.execute("DELETE FROM keyed WHERE id = %s", [key])
    elif kind == 6:
        conn.execute(
            "INSERT INTO keyed VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET v = 'again'",
            [key, f"i{n}"],
        )
    elif kind == 7:
        conn.execute("UPDATE keyed SET id = id + 1000 WHERE id = %s", [key])
    elif kind == 8:
        conn.execute(
            "INSERT INTO other VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
            [key, f"o{n}"],
        )
    else:
        conn.execute("INSERT INTO bag VALUES (%s, %s)", [key, f"b{n}"])


def test_batches_formed_while_the_last_is_written_land_as_the_publisher_has_them(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Single-row transactions keep arriving while batches are written: the next batch is
    split and collapsed as they arrive. A column added, a TRUNCATE and a table's first
    batch in the run fall back to the turn; the tables equal the publisher's either way."""
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 150, "max_delay": "50ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed SELECT g, 'v' || g, 0 FROM generate_series(1, 500) g")
        rep.caught_up()
        with capture_logs() as logs, Writer(publisher, one_change, pause=0.002) as writer:

            def formed() -> list[Any]:
                applied = [e for e in logs if e.get("event") == "batch applied"]
                return [e for e in applied if e["formed_ahead"]]

            wait_until(lambda: len(formed()) >= 5, timeout=120, what="batches formed ahead")
            publisher.execute("ALTER TABLE keyed ADD COLUMN w text")
            wait_until(lambda: writer.written >= 1200, timeout=120, what="1,200 transactions")
            publisher.execute("TRUNCATE bag")
            seen = len(formed())
            wait_until(lambda: len(formed()) >= seen + 5, timeout=120, what="formed again")
            writer.stop()
        rep.caught_up()
        rep.assert_equal("public.keyed", "public.other", key=("id",))
        rep.assert_equal("public.bag")
    applied = [e for e in logs if e.get("event") == "batch applied"]
    assert [e for e in applied if not e["formed_ahead"]], "some batches fell back to the turn"
