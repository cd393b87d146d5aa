"""The whole chain is real: PostgreSQL -> psycopg -> Spark -> Delta -> oracle."""

from pathlib import Path
from typing import Any

import pytest

from tests.support.oracle import (
    diff_delta_against_publisher,
    publisher_columns,
    read_publisher,
)
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE public.smoke (
    id bigint PRIMARY KEY,
    flag boolean,
    small smallint,
    qty integer,
    ratio real,
    score double precision,
    price numeric(12, 2),
    big numeric,
    name text,
    code char(3),
    payload bytea,
    uid uuid,
    day date,
    at timestamp,
    at_tz timestamptz,
    span interval,
    doc jsonb,
    tags text[],
    nums integer[],
    feeling mood
);
INSERT INTO public.smoke
SELECT g, g % 2 = 0, g::smallint, g * 10, g / 3.0, g / 7.0, g * 1.25, g ^ 40::numeric,
       'row ' || g, 'c' || (g % 10), decode(md5(g::text), 'hex'), md5(g::text)::uuid,
       date '2024-01-01' + g, timestamp '2024-01-01 00:00' + g * interval '1 hour',
       timestamptz '2024-01-01 00:00+02' + g * interval '1 minute', g * interval '1 day',
       jsonb_build_object('g', g, 'list', jsonb_build_array(g, 'x')),
       ARRAY['a' || g, NULL, 'b'], ARRAY[g, g + 1], (ARRAY['sad','ok','happy'])[1 + g % 3]::mood
  FROM generate_series(1, 200) g;
INSERT INTO public.smoke (id) VALUES (0);
UPDATE public.smoke SET ratio = 'NaN', score = '-Infinity' WHERE id = 7;
"""


def write_delta_copy(publisher: PgDatabase, spark: Any, path: Path) -> None:
    """Read the publisher's rows with psycopg and write them with Spark to Delta."""
    with publisher.connect() as conn:
        columns = publisher_columns(conn, "public.smoke")
        rows = read_publisher(conn, "public.smoke", columns)
    ddl = ", ".join(f"`{c.name}` {c.spark_type}" for c in columns)
    spark.createDataFrame(rows, schema=ddl).write.format("delta").save(str(path))


def test_publisher_rows_round_trip_through_delta(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(SCHEMA)
    path = warehouse / "public" / "smoke"
    write_delta_copy(publisher, spark, path)

    with publisher.connect() as conn:
        diff = diff_delta_against_publisher(conn, "public.smoke", spark, str(path), key=["id"])
    assert not diff, diff.report()
    assert spark.read.format("delta").load(str(path)).count() == 201

    publisher.execute("UPDATE public.smoke SET doc = '{\"changed\": true}' WHERE id = 42")
    with publisher.connect() as conn:
        diff = diff_delta_against_publisher(conn, "public.smoke", spark, str(path), key=["id"])
    assert len(diff.changed) == 1
    _expected, _actual, cells = diff.changed[0]
    assert cells == ["doc"]
    assert "changed: doc" in diff.report()
    assert not diff.missing and not diff.extra
