"""MERGE statements are values: their text, tested without Spark."""

import random
from unittest.mock import patch

import pyarrow as pa

from apply.batching.source import FIRST, PRESENT
from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import ColumnType
from apply.plans import merge_plan
from apply.plans.merge_plan import (
    ClauseKind,
    OnExists,
    conflict_in,
    expected_counts,
    key_bounds,
    keyed_merge,
    merge_sql,
    multiset_merge,
)
from conflicts.kinds import First

SCHEMA = TargetSchema(
    "public.t",
    (TargetColumn("id", ColumnType(23)), TargetColumn("we`ird", ColumnType(25))),
    ("id",),
)


def test_keyed_merge_matches_on_the_key_and_quotes_identifiers() -> None:
    plan = keyed_merge(SCHEMA, keep_columns=(1,))
    assert plan.condition == "t.`id` = s.`id`"
    kinds = [c.kind for c in plan.clauses]
    assert kinds == [
        ClauseKind.MATCHED_UPDATE,  # insert_exists / update_exists -> raise_error
        ClauseKind.MATCHED_DELETE,
        ClauseKind.MATCHED_UPDATE,
        ClauseKind.NOT_MATCHED_INSERT,
    ]
    assert "raise_error" in plan.clauses[0].assignments["`id`"]
    update = plan.clauses[2].assignments
    assert update["`we``ird`"] == (
        "CASE WHEN s.__pgsub_keep_1 THEN t.`we``ird` ELSE s.`we``ird` END"
    )
    assert "s.__pgsub_reinserted" in (plan.clauses[3].condition or "")


def test_apply_remote_has_no_error_clause() -> None:
    plan = keyed_merge(SCHEMA, keep_columns=(), on_exists=OnExists.APPLY_REMOTE)
    assert all("raise_error" not in str(c.assignments) for c in plan.clauses)


def test_multiset_merge_compares_every_column_null_safe() -> None:
    plan = multiset_merge(SCHEMA)
    assert (
        plan.condition == "s.__pgsub_remove AND t.`id` <=> s.`id` AND t.`we``ird` <=> s.`we``ird`"
    )


def test_conflict_kind_is_read_back_from_the_error() -> None:
    assert (
        conflict_in("[USER_RAISED_EXCEPTION] pgsub conflict:insert_exists SQLSTATE")
        == "insert_exists"
    )
    assert conflict_in("something else") is None


def test_a_merge_carries_only_the_clauses_the_batch_can_take() -> None:
    import pyarrow as pa

    from apply.plans.merge_plan import Shape, shape_of

    updates = pa.table(
        {
            "__pgsub_first": ["UPDATE", "UPDATE"],
            "__pgsub_present": [True, True],
            "__pgsub_reinserted": [False, False],
        }
    )
    assert shape_of(updates) == Shape(
        expects_absent=False, inserts=False, updates=True, deletes=False
    )
    plan = keyed_merge(SCHEMA, keep_columns=(), shape=shape_of(updates))
    assert [c.kind for c in plan.clauses] == [ClauseKind.MATCHED_UPDATE]
    assert "raise_error" not in str(plan.clauses[0].assignments)
    mixed = pa.table(
        {
            "__pgsub_first": ["INSERT", "DELETE", "DELETE"],
            "__pgsub_present": [False, False, True],
            "__pgsub_reinserted": [False, False, True],
        }
    )
    assert shape_of(mixed) == Shape(expects_absent=True, inserts=True, updates=True, deletes=True)


def test_an_integer_key_bounds_the_target_to_the_batch_range() -> None:
    source = pa.table({"id": pa.array([7, -3, 12], pa.int64()), "v": ["a", "b", "c"]})
    assert key_bounds(source, "id") == (-3, 12)
    assert key_bounds(source, "v") is None  # only integers: their order is Spark's order
    assert key_bounds(source.slice(0, 0), "id") is None
    plan = keyed_merge(SCHEMA, keep_columns=(), bounds=(-3, 12))
    assert plan.condition == "t.`id` = s.`id` AND t.`id` BETWEEN -3 AND 12"


def test_a_plan_reads_as_one_merge_into_statement_in_clause_order() -> None:
    plan = keyed_merge(SCHEMA, keep_columns=())
    sql = merge_sql(plan, "delta.`/w/public/t`", "pgsub_merge_source_7").split("\n")
    assert sql[0] == (
        "MERGE INTO delta.`/w/public/t` AS t USING pgsub_merge_source_7 AS s ON t.`id` = s.`id`"
    )
    assert sql[1].startswith("WHEN MATCHED AND (s.__pgsub_first IN ('INSERT', 'KEY_UPDATE_NEW'))")
    assert "THEN UPDATE SET `id` = raise_error(" in sql[1]
    assert sql[2] == "WHEN MATCHED AND (NOT s.__pgsub_present) THEN DELETE"
    assert sql[3] == "WHEN MATCHED THEN UPDATE SET `id` = s.`id`, `we``ird` = s.`we``ird`"
    assert sql[4] == (
        "WHEN NOT MATCHED AND (s.__pgsub_present AND (s.__pgsub_first IN ('INSERT', "
        "'KEY_UPDATE_NEW') OR s.__pgsub_reinserted)) THEN INSERT (`id`, `we``ird`) "
        "VALUES (s.`id`, s.`we``ird`)"
    )
    assert len(sql) == 5


def test_a_multiset_plan_deletes_unconditionally_and_inserts_what_stays() -> None:
    sql = merge_sql(multiset_merge(SCHEMA), "delta.`/t`", "v").split("\n")
    assert sql[1] == "WHEN MATCHED THEN DELETE"
    assert sql[2].startswith("WHEN NOT MATCHED AND (NOT s.__pgsub_remove) THEN INSERT")


def test_a_small_sources_counts_taken_in_python_are_arrows() -> None:
    rng = random.Random(5)
    firsts = [f.value for f in First]
    for rows in (0, 1, 7, 300):
        source = pa.table(
            {
                FIRST: pa.array([rng.choice(firsts) for _ in range(rows)], pa.string()),
                PRESENT: pa.array([rng.random() < 0.6 for _ in range(rows)], pa.bool_()),
            }
        )
        with patch.object(merge_plan, "_COUNTED_IN_PYTHON", 10**6):
            in_python = expected_counts(source)
        with patch.object(merge_plan, "_COUNTED_IN_PYTHON", -1):
            by_arrow = expected_counts(source)
        assert in_python == by_arrow
        assert rows < 300 or min(in_python) > 0  # each kind of row is there to count
