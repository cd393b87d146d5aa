"""A table's copy read off libpq into typed blocks (``tablesync.copy.copied_blocks``), as the
first start's load reads each table on one connection under a savepoint: a table whose copy
fails while it is read leaves the connection to roll back to it and copy the next one."""

from __future__ import annotations

import functools

import pyarrow as pa
import pytest

from apply.columns.columnar import ValueConversionError
from apply.columns.schema import target_schema
from subscriber.replication import session
from subscriber.replication.catalog import PublisherCatalog
from tablesync import copy
from tablesync.copy import copied_blocks
from tablesync.publication import describe, published_tables
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.integration


def test_a_table_that_fails_while_read_leaves_the_connection_to_the_next(
    publisher: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``bad`` has a date Delta cannot hold in its 15,000th row: its third block fails to
    # parse while the server is still sending the rest of the table.
    publisher.execute(
        "CREATE TABLE bad (id int PRIMARY KEY, d date);"
        "INSERT INTO bad SELECT g, CASE WHEN g = 15000 THEN 'infinity'::date "
        "ELSE date '2020-01-01' + g END FROM generate_series(1, 200000) g;"
        "CREATE TABLE good (id int PRIMARY KEY, v text);"
        "INSERT INTO good SELECT g, 'v' || g FROM generate_series(1, 3000) g;"
        "CREATE PUBLICATION pub FOR TABLE bad, good"
    )
    monkeypatch.setattr(copy, "blocks", functools.partial(copy.blocks, block_bytes=64 << 10))
    catalog = PublisherCatalog(publisher.dsn)
    with session.connect(publisher.dsn) as conn:
        tables = {t.name: t for t in published_tables(conn, ["pub"])}
        schemas = {
            name: target_schema(describe(conn, table), catalog.type_row, keyed=True)
            for name, table in tables.items()
        }
        catalog.close()
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute("SAVEPOINT pgsub_table")
        read = copied_blocks(conn, tables["bad"].copy_query(), schemas["bad"])
        with pytest.raises(ValueConversionError, match="infinity"):
            for _ in read:
                pass
        conn.execute("ROLLBACK TO SAVEPOINT pgsub_table")
        conn.execute("SAVEPOINT pgsub_table")
        good = pa.concat_tables(copied_blocks(conn, tables["good"].copy_query(), schemas["good"]))
        conn.execute("RELEASE SAVEPOINT pgsub_table")
        conn.execute("COMMIT")
    assert good.num_rows == 3000
    assert sorted(good.column("id").to_pylist()) == list(range(1, 3001))
