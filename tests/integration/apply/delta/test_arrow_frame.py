"""Arrow data handed to Spark arrives whole, whatever its chunks."""

from typing import Any

import pyarrow as pa
import pytest

from apply.delta.spark.session import arrow_frame

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sizes", [(1, 0, 200), (0, 0, 3), (5, 0), (0,), (2, 3)])
def test_every_row_arrives_whatever_the_chunks(sizes: tuple[int, ...], spark: Any) -> None:
    start = 0
    parts = []
    for size in sizes:
        parts.append(pa.table({"a": pa.array(range(start, start + size), pa.int32())}))
        start += size
    table = pa.concat_tables(parts)
    rows = arrow_frame(spark, table, "a int").collect()
    assert sorted(r["a"] for r in rows) == list(range(start))
