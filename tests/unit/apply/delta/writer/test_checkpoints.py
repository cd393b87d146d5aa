"""Checkpoints at versions of each table's own (``apply.delta.writer.overwrite.checkpoint_due``)."""

from collections import Counter

from apply.delta.writer.overwrite import checkpoint_due


def test_tables_written_by_the_same_batches_do_not_checkpoint_together() -> None:
    """200 tables, one commit each per batch: before, all 200 checkpointed in one batch
    every 100 (a 6 s stall); now each once per interval, a few per batch."""
    folders = [f"/warehouse/ours/t{n}" for n in range(200)]
    due = Counter(
        version
        for folder in folders
        for version in range(1, 101)
        if checkpoint_due(version, {}, folder)
    )
    assert sum(due.values()) == 200  # each table once in 100 versions
    assert max(due.values()) <= 10
    interval = {"delta.checkpointInterval": "10"}
    assert sum(checkpoint_due(v, interval, folders[0]) for v in range(1, 101)) == 10
    assert checkpoint_due(7, interval, "/w/t/") == checkpoint_due(7, interval, "/w/t")
