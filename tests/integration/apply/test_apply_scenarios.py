"""Net-effect scenarios (docs/architecture.md, "Batches"), real publisher and Delta tables."""

from pathlib import Path
from typing import Any

import pytest

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN price AS numeric(10, 2);
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE typed (
    id bigint PRIMARY KEY, flag boolean, small smallint, qty integer, ratio real,
    score double precision, amount numeric(12, 2), big numeric, name text, code char(3),
    label varchar(20), payload bytea, uid uuid, day date, at timestamp, at_tz timestamptz,
    clock time, clock_tz timetz, span interval, doc json, docb jsonb, tags text[],
    nums integer[], days date[], moods mood[], feeling mood, cost price, n posint
);
CREATE PUBLICATION pub FOR TABLE typed;
"""

TYPED_ROWS = """
SET TIME ZONE 'America/New_York';
INSERT INTO typed
SELECT g, g % 2 = 0, g::smallint, g * 10, g / 3.0, g / 7.0, g * 1.25, g ^ 40::numeric,
       'row ' || g, 'c' || (g % 10), 'lbl' || g, decode(md5(g::text), 'hex'), md5(g::text)::uuid,
       date '2024-01-01' + g, timestamp '2024-01-01 00:00' + g * interval '1 hour 1 second',
       timestamptz '2024-03-10 01:00-05' + g * interval '17 minutes',
       time '12:00' + g * interval '1 minute',
       timetz '12:00+02', g * interval '1 day 3 seconds', '{"a": [1, 2]}',
       jsonb_build_object('g', g),
       ARRAY['a' || g, NULL, 'q"uote'], ARRAY[g, NULL], ARRAY[date '2024-01-01' + g],
       ARRAY['sad', 'happy']::mood[], (ARRAY['sad','ok','happy'])[1 + g % 3]::mood, g / 4.0, g
  FROM generate_series(1, 40) g;
INSERT INTO typed (id) VALUES (0);
UPDATE typed SET ratio = 'NaN', score = '-Infinity', big = 'NaN' WHERE id = 7;
UPDATE typed SET score = 'Infinity', at_tz = '1999-12-31 23:59:59.999999+14' WHERE id = 8;
UPDATE typed SET name = 'ünïcødé ✓', payload = '\\x00', docb = '{"nested": {"k": null}}'
 WHERE id = 9;
-- Edges of the text forms that binary mode must write exactly as text mode does.
INSERT INTO typed (id, span, clock, clock_tz, big, amount, code, nums, tags, days) VALUES
  (41, '-1 year -2 mons +3 days -04:05:06.5', '24:00:00', '12:34:56.789+05:30',
   '0.000123', -12.3, 'a', '{}', ARRAY['', NULL], ARRAY[NULL, date '1999-02-28']::date[]),
  (42, '1 mon -1 day', '00:00:00.000001', '23:59:59.999999-11:45', '-0.5', 0, 'xyz',
   '{-2147483648,2147483647}', '{}', '{}'),
  (43, '-00:00:00.000001', '00:00:00', '00:00:00+00', '100000000000000000000.10', 9999999999.99,
   NULL, ARRAY[NULL]::int[], ARRAY['{"a":1}'], ARRAY[date '2099-12-31']),
  (44, '0', '13:00:00.1', '01:02:03-08', '1e-20', -0.01, '', NULL, NULL, NULL),
  (45, '1 year 2 days 00:00:01', NULL, NULL, '-123456789.987654321', NULL, NULL, NULL,
   NULL, NULL),
  (46, '-3 days', NULL, NULL, '0', NULL, NULL, NULL, NULL, NULL),
  (47, '-1 mons +1 day -00:00:01', NULL, NULL, 'Infinity', NULL, NULL, NULL, NULL, NULL),
  (48, '2 years -00:00:00.25', NULL, NULL, '-Infinity', NULL, NULL, NULL, NULL, NULL);
UPDATE typed SET small = -32768, qty = -1, ratio = '-Infinity', score = -0.0, uid =
  'ffffffff-0000-0000-0000-000000000001', at = '1969-12-31 23:59:59.5',
  at_tz = '1901-01-01 00:00+00', day = '1970-01-01', feeling = 'ok', flag = false WHERE id = 41;
"""


def test_every_design_type_round_trips(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    publisher.execute(TYPES)
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute(TYPED_ROWS)
        rep.caught_up()
        rep.assert_equal("public.typed", key=("id",))
        schema = {
            f.name: f.dataType.simpleString()
            for f in spark.read.format("delta").load(rep.path("public.typed")).schema.fields
        }
        assert schema["at"] == "timestamp_ntz" and schema["at_tz"] == "timestamp"
        assert schema["amount"] == "decimal(12,2)" and schema["cost"] == "decimal(10,2)"
        assert schema["big"] == "string" and schema["n"] == "int" and schema["feeling"] == "string"
        assert schema["moods"] == "array<string>" and schema["days"] == "array<date>"
        assert schema["small"] == "smallint" and schema["payload"] == "binary"


def test_binary_mode_writes_the_same_tables_as_text_mode(
    publisher_any: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """``binary: true`` on every publisher major: the same oracle as text mode, every type."""
    publisher = publisher_any
    publisher.execute(TYPES)
    with Replication(publisher, spark, warehouse, binary=True) as rep:
        publisher.execute(TYPED_ROWS)
        publisher.execute("DELETE FROM typed WHERE id IN (3, 42)")  # binary keys of deletes
        publisher.execute("UPDATE typed SET id = id + 100 WHERE id IN (4, 43)")
        rep.caught_up()
        rep.assert_equal("public.typed", key=("id",))
        assert publisher.fetchval("SELECT count(*) FROM typed") == 47


def test_binary_mode_reads_a_type_without_binary_output_as_text(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A base type with no send function: pgoutput sends its values as text even in binary
    mode, and they are applied as text beside the binary ones, as PostgreSQL does."""
    publisher.execute(
        "CREATE TYPE plain;"
        "CREATE FUNCTION plain_in(cstring) RETURNS plain AS 'textin' LANGUAGE internal STRICT;"
        "CREATE FUNCTION plain_out(plain) RETURNS cstring AS 'textout' LANGUAGE internal STRICT;"
        "CREATE TYPE plain (INPUT = plain_in, OUTPUT = plain_out, LIKE = text);"  # no SEND
        "CREATE TABLE p (id int PRIMARY KEY, v plain, n int); CREATE PUBLICATION pub FOR TABLE p"
    )
    assert publisher.fetchval("SELECT typsend = 0 FROM pg_type WHERE typname = 'plain'")
    with Replication(publisher, spark, warehouse, binary=True) as rep:
        publisher.execute(
            "INSERT INTO p SELECT g, plain_in(('v' || g)::cstring), g FROM generate_series(1, 5) g"
        )
        publisher.execute("UPDATE p SET v = 'changed' WHERE id = 2")
        rep.caught_up()
        assert sorted((r["id"], r["v"], r["n"]) for r in rep.rows("public.p")) == [
            (1, "v1", 1), (2, "changed", 2), (3, "v3", 3), (4, "v4", 4), (5, "v5", 5),
        ]  # fmt: skip


def test_unrepresentable_value_stops_at_exactly_its_transaction(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE d (id int PRIMARY KEY, day date); CREATE PUBLICATION pub FOR TABLE d"
    )
    with Replication(publisher, spark, warehouse, batch={"max_delay": "4s"}) as rep:
        # Three transactions that land in one batch; the middle one cannot be applied.
        publisher.execute("INSERT INTO d VALUES (1, '2024-01-01')")
        bad_xid = publisher.fetchval(
            "INSERT INTO d VALUES (2, 'infinity') RETURNING txid_current()::text"
        )
        publisher.execute("INSERT INTO d VALUES (3, '2024-01-03')")
        runner = rep.runner
        assert runner is not None

        def names_one_transaction() -> bool:
            return f"in transaction {bad_xid} finished at" in (runner.status.last_error or "")

        wait_until(names_one_transaction, timeout=120, what="an error naming the bad transaction")
        error = runner.status.last_error or ""
        assert "column 'day' (date): infinity has no date representation" in error
        assert 'for replication target relation "public.d"' in error
        assert "infinity" not in error.split("CONTEXT")[1]  # no row values in the context
        # The transaction before it was applied on its own; nothing after it was.
        assert sorted(r["id"] for r in rep.rows("public.d")) == [1]
        errors = rep.metrics.registry.get_sample_value(
            "pgsub_apply_errors_total", {"subscription": "sub1"}
        )
        assert errors is not None and errors >= 2  # it keeps retrying, as PostgreSQL does


def test_unchanged_toast_values_are_kept(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE big (id int PRIMARY KEY, n int, doc text, blob bytea);"
        "ALTER TABLE big ALTER COLUMN doc SET STORAGE EXTERNAL;"
        "CREATE PUBLICATION pub FOR TABLE big"
    )
    with Replication(publisher, spark, warehouse, batch={"max_changes": 3}) as rep:
        publisher.execute(
            "INSERT INTO big SELECT g, 0, repeat(md5(g::text), 400),"
            " decode(repeat(md5(g::text), 300), 'hex') FROM generate_series(1, 6) g"
        )
        rep.caught_up()
        # Updates of other columns: pgoutput sends 'u' for doc and blob.
        publisher.execute("UPDATE big SET n = n + 1 WHERE id <= 4")
        publisher.execute("UPDATE big SET n = n + 1 WHERE id = 1")
        # A key change with an unchanged TOAST value moves it to the new key.
        publisher.execute("UPDATE big SET id = 100 WHERE id = 2")
        # Insert and update in one batch: the value comes from the chain.
        publisher.execute(
            "BEGIN; INSERT INTO big VALUES (7, 0, repeat('x', 9000), NULL);"
            " UPDATE big SET n = 5 WHERE id = 7; COMMIT"
        )
        rep.caught_up()
        rep.assert_equal("public.big", key=("id",))


def test_replica_identity_full_keeps_duplicates_exact(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE bag (a int, b text, f float8);"
        "ALTER TABLE bag REPLICA IDENTITY FULL;"
        "CREATE TABLE log (a int, b text);"  # no identity: inserts only
        "CREATE PUBLICATION pub FOR TABLE bag, log"
    )
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute(
            "INSERT INTO bag VALUES (1, 'x', 0.5), (1, 'x', 0.5), (1, 'x', 0.5), (2, NULL, 'NaN');"
            "INSERT INTO log VALUES (1, 'a'), (1, 'a')"
        )
        rep.caught_up()
        rep.assert_equal("public.bag", "public.log")
        # One DELETE of one of three equal rows removes exactly one copy.
        publisher.execute("DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 1)")
        publisher.execute(
            "UPDATE bag SET b = 'y' WHERE ctid = (SELECT max(ctid) FROM bag WHERE a = 1)"
        )
        publisher.execute("UPDATE bag SET a = 3 WHERE b IS NULL")  # NULL and NaN compared exactly
        publisher.execute("INSERT INTO log VALUES (1, 'a')")
        rep.caught_up()
        rep.assert_equal("public.bag", "public.log")
        assert sorted((r["a"], r["b"]) for r in rep.rows("public.bag")) == [
            (1, "x"),
            (1, "y"),
            (3, None),
        ]
        # A batch that removes the last copy of a row (no copy to put back) and inserts new
        # rows: the inserts follow an empty Arrow chunk, which Spark once read as the end.
        publisher.execute(
            "BEGIN; DELETE FROM bag WHERE a = 3;"
            " INSERT INTO bag SELECT g, 'new', 1 FROM generate_series(10, 14) g; COMMIT"
        )
        rep.caught_up()
        rep.assert_equal("public.bag", "public.log")
        assert len(rep.rows("public.bag")) == 7
        # A batch that only removes the last copy of a row and inserts nothing.
        publisher.execute("DELETE FROM bag WHERE a = 3 OR b = 'new'")
        rep.caught_up()
        rep.assert_equal("public.bag", "public.log")
        assert sorted((r["a"], r["b"]) for r in rep.rows("public.bag")) == [(1, "x"), (1, "y")]


def test_truncate_is_a_barrier_inside_a_batch(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (x int);"
        "CREATE TABLE c (id serial PRIMARY KEY, v text);"
        "CREATE PUBLICATION pub FOR TABLE a, b, c"
    )
    with Replication(
        publisher, spark, warehouse, batch={"max_changes": 100_000, "max_delay": "3s"}
    ) as rep:
        publisher.execute(
            "INSERT INTO a VALUES (1, 'keep?'), (2, 'x'); INSERT INTO b VALUES (1), (1)"
        )
        rep.caught_up()
        # Within one batch: rows before, a TRUNCATE of several tables, rows after.
        publisher.execute(
            "INSERT INTO a VALUES (3, 'before'); INSERT INTO b VALUES (2);"
            "INSERT INTO c (v) VALUES ('c1');"
            "TRUNCATE a, b, c RESTART IDENTITY;"
            "INSERT INTO a VALUES (2, 'after'); INSERT INTO b VALUES (3), (3);"
            "INSERT INTO c (v) VALUES ('restarted')"
        )
        rep.caught_up()
        rep.assert_equal("public.a", key=("id",))
        rep.assert_equal("public.b", "public.c")
        assert rep.rows("public.c") == [{"id": 1, "v": "restarted"}]


def test_added_column_mid_stream(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(
        publisher, spark, warehouse, batch={"max_changes": 100_000, "max_delay": "3s"}
    ) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'a')")
        rep.caught_up()
        publisher.execute(
            "INSERT INTO t VALUES (2, 'b');"
            "ALTER TABLE t ADD COLUMN extra int, ADD COLUMN note text;"
            "INSERT INTO t VALUES (3, 'c', 30, 'n');"
            "UPDATE t SET extra = 10 WHERE id = 1"
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
        publisher.execute(
            "ALTER TABLE t DROP COLUMN note; ALTER TABLE t ALTER COLUMN extra TYPE bigint"
        )
        publisher.execute("INSERT INTO t VALUES (4, 'd', 40)")
        rep.caught_up()
        # The widening rewrote the small table with the wider type: delta-rs reads it too.
        rep.assert_equal("public.t", key=("id",))
        schema = {
            f.name: f.dataType.simpleString()
            for f in spark.read.format("delta").load(rep.path("public.t")).schema.fields
        }
        assert schema == {"id": "int", "v": "string", "extra": "bigint", "note": "string"}
