"""Spark's Delta operations: SQL and the DataFrame API, on any Spark.

The session (``session``) and the table operations written once (``sql``), a target
table with its marked commits (``target``), the MERGE writers (``keyed``, ``multiset``,
``moved``, ``findings``, ``origins``: row tracking), table definitions and their evolution
(``definition``, ``ddl``, ``detail``), staged copies (``staged_copy``) and OPTIMIZE and
VACUUM (``maintenance``). Every Spark Delta operation is SQL or a DataFrame, so a local
Spark, a cluster and a Spark Connect server take the same path. Imports:
``apply.delta.writer`` (delta-rs's reads of a table) and ``apply.delta.files``.
"""
