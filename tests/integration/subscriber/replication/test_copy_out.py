"""A copy read off libpq (``subscriber.replication.copy_out``): the rows psycopg's own
``Copy`` reads, the server's errors as psycopg raises them, and the connection left to take
its next command however the copy ended."""

from __future__ import annotations

import psycopg
import pytest

from subscriber.replication.copy_out import copy_out
from subscriber.replication.errors import ReplicationError
from subscriber.replication.stream import ReplicationConnection
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.integration

COPY = "COPY (SELECT * FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv)"


@pytest.fixture
def table(publisher: PgDatabase) -> PgDatabase:
    """Rows whose CSV has quotes, commas, newlines in a value, NULLs, empty strings and
    multi-byte characters, and enough of them that the copy spans many socket reads."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text, w text);"
        "INSERT INTO t SELECT g, CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN '' "
        "WHEN 2 THEN E'a \"quoted\", two\\nlines' WHEN 3 THEN 'é ü 日本' ELSE md5(g::text) END, "
        "repeat('x', g % 300) FROM generate_series(1, 60000) g"
    )
    return publisher


def test_the_rows_are_psycopgs_own(table: PgDatabase) -> None:
    with table.connect() as conn:
        with conn.cursor().copy(COPY) as copy:
            expected = [bytes(row) for row in copy]
        rows = list(copy_out(conn.pgconn, COPY))
        assert conn.execute("SELECT 1").fetchone() == (1,)  # idle, takes its next command
    assert len(expected) == 60000
    assert rows == expected
    assert all(type(row) is bytes for row in rows)


def test_the_servers_error_is_psycopgs_and_the_connection_goes_on(table: PgDatabase) -> None:
    with table.connect() as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            list(copy_out(conn.pgconn, "COPY (SELECT * FROM missing) TO STDOUT"))
        # An error after rows were sent: the rows came, then the error.
        failing = "COPY (SELECT 1 / (g - 30000) FROM generate_series(1, 40000) g) TO STDOUT"
        rows = []
        with pytest.raises(psycopg.errors.DivisionByZero):
            for row in copy_out(conn.pgconn, failing):
                rows.append(row)
        assert rows  # the rows before the failing one arrived first
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_copy_given_up_is_cancelled_and_its_transaction_goes_on(table: PgDatabase) -> None:
    """The initial load reads each table under a savepoint and, when one fails while it is
    read, rolls back to it and copies the next table on the same connection."""
    with table.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute("SAVEPOINT pgsub_table")
        big = "COPY (SELECT g, repeat('y', 100) FROM generate_series(1, 5000000) g) TO STDOUT"
        rows = copy_out(conn.pgconn, big)
        assert next(rows) == b"1\t" + b"y" * 100 + b"\n"
        rows.close()  # the reader stopped: the query is cancelled, not read to its end
        conn.execute("ROLLBACK TO SAVEPOINT pgsub_table")
        again = list(copy_out(conn.pgconn, COPY))
        assert again[0].startswith(b"1,") and len(again) == 60000
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("COMMIT")


def test_the_replication_connection_says_what_failed(table: PgDatabase) -> None:
    with ReplicationConnection(table.dsn) as connection:
        rows = list(connection.copy_out(COPY))
        assert len(rows) == 60000
        with pytest.raises(ReplicationError, match=r"COPY failed: .*missing"):
            list(connection.copy_out("COPY (SELECT * FROM missing) TO STDOUT"))
        assert connection.execute("IDENTIFY_SYSTEM")[0]["systemid"]
