"""A publisher whose defaults print values differently: every copy path and the stream.

``DateStyle``, ``TimeZone``, ``IntervalStyle``, ``bytea_output`` and
``extra_float_digits`` all change the text forms a server writes. pgsub's
connections set their own (``subscriber.replication.session``), so the
tables must equal the publisher's whatever its defaults: the first start's
load under the subscription slot's snapshot, the copy in one range in its
sync slot's transaction, in CTID ranges read by threads, staged (resumable)
ranges, and the stream in text and in binary mode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from subscriber.replication import session
from tests.support.oracle import DELTA_RS, SPARK, assert_delta_equals_publisher
from tests.support.pgcluster import PgCluster
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

ODD_DEFAULTS = {
    "DateStyle": "'SQL, DMY'",
    "TimeZone": "'America/New_York'",
    "IntervalStyle": "sql_standard",
    "bytea_output": "escape",
    "extra_float_digits": "0",
}

TABLE = """
CREATE TABLE odd (
    id int PRIMARY KEY, by bytea, day date, at timestamp, at_tz timestamptz, span interval,
    clock time, clock_tz timetz, ratio real, score double precision, amount numeric(12, 3),
    days date[], spans interval[], blobs bytea[], doc jsonb, ip inet, r tstzrange
);
INSERT INTO odd
SELECT g, decode(md5(g::text) || '00ff5c27', 'hex'), date '2024-02-29' + g,
       timestamp '2024-01-31 23:59:59.123456' + g * interval '1 hour',
       timestamptz '2024-03-10 01:30:00-05' + g * interval '17 minutes',
       g * interval '1 day -3 hours 4.5 seconds' - interval '2 years',
       time '00:00:01' + g * interval '1 minute', timetz '23:59:59.5-03:30',
       g / 3.0, g / 7.0 + 1e-15, g * 1.125,
       ARRAY[date '1999-12-31' + g, NULL], ARRAY[interval '-1 mon 2 days', NULL],
       ARRAY[decode('5c00', 'hex'), NULL], jsonb_build_object('f', g / 3.0),
       '2001:db8::1', tstzrange(timestamptz '2024-01-01 10:00+00', NULL)
  FROM generate_series(1, 20000) g;
CREATE PUBLICATION pub FOR TABLE odd;
"""

CHANGES = """
UPDATE odd SET span = '-1 year 2 mons -3 days 04:05:06.789', by = '\\x5c5c00',
               at_tz = '2024-11-03 01:30:00-04', day = '2024-12-31', score = 1e-300
 WHERE id % 1000 = 0;
DELETE FROM odd WHERE id % 1000 = 1;
INSERT INTO odd (id, by, span, score, days) VALUES (30001, '\\x00', '1 day', -0.0, '{}');
"""

# Every copy path once; the stream after it in text mode, and in binary mode once (the
# stream does not depend on how the copy was read).
CASES = {
    "first start's load, text stream": ({"ranges": 1, "readers": 1}, False),
    "one range in the sync slot's transaction, text stream": (
        {"ranges": 1, "readers": 1, "initial_load": False},
        False,
    ),
    "ranges by threads, binary stream": ({"ranges": 4, "readers": 2, "resumable": False}, True),
    "staged ranges, text stream": ({"ranges": 4, "readers": 2, "resumable": True}, False),
}


@pytest.mark.parametrize(("copy", "binary"), list(CASES.values()), ids=list(CASES))
def test_a_publisher_with_odd_defaults_replicates_exactly(
    pg_cluster: Callable[..., PgCluster],
    spark: Any,
    tmp_path: Path,
    copy: dict[str, Any],
    binary: bool,
) -> None:
    publisher = PgDatabase.create(pg_cluster(**ODD_DEFAULTS), "odd")
    assert publisher.fetchval("SHOW bytea_output") == "escape"  # what a plain session gets
    publisher.execute(TABLE)
    with Replication(publisher, spark, tmp_path, copy_data=True, copy=copy, binary=binary) as rep:
        rep.caught_up()
        from tests.support.pgcluster import wait_until

        wait_until(rep.all_ready, timeout=180, what="the table to be READY")
        publisher.execute(CHANGES)
        rep.caught_up()
        # The oracle reads the publisher in the forms pgsub must hold (ISO, UTC, hex).
        with session.connect(publisher.dsn) as conn:
            assert_delta_equals_publisher(
                conn, "public.odd", spark, rep.path("public.odd"), ("id",), (SPARK, DELTA_RS)
            )
