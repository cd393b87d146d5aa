"""pgsub's own Delta writer: its commits, its deletion vectors, its replay of the log.

A small Delta implementation of its own, for what a batch writes without Spark: a
small table rewritten (``overwrite``), rows appended (``overwrite.append``), a keyed
table's batches written as new files plus deletion vectors (``vector_write``, with
``key_index``, ``key_lookup``, ``deletion_vectors``), the live files read from the log by
its own replay (``live_files``), an open table kept between batches (``open_table``), the
choice among these and delta-rs's MERGE (``local_merge``), the write cost that decides
(``write_cost``), the protocol change that turns vectors on (``protocol``), the
statistics of the files it adds (``file_stats``), durability before confirmation
(``durability``) and delta-rs's access to a table (``local_tables``).

The protocol it writes (docs/tables.md, "pgsub's own commits"): reader 1 / writer 2, or
reader 3 / writer 7 with ``deletionVectors`` (reader and writer), ``timestampNtz``,
``appendOnly`` and ``invariants`` listed but unused - the sets checked are
``overwrite.HAND_READS`` and ``HAND_WRITES``, ``vector_write.VECTOR_READS`` and
``VECTOR_WRITES``. It reads classic and multi-part checkpoints and the vectors other
writers made (inline, UUID-relative and absolute). It refuses - leaving the batch to
Spark, which reads everything - column mapping, type widening, row tracking, the change
data feed, partitions, ``v2Checkpoint`` (V2 and UUID checkpoints, sidecars:
``vector_write.REPLAY_REFUSES``) and every feature it does not list. Commits are
put-if-absent (``apply.delta.files.store``) and read back before a batch is confirmed.

Imports: ``apply.delta.files``, apply's lower stages, deltalake and pyarrow; never Spark
(a contract of ``.importlinter``).
"""
