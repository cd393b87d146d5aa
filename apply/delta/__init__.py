"""The Delta tables: the only package that imports pyspark, delta, py4j or deltalake.

Its rooms, bottom to top (a layers contract of ``.importlinter``):

- ``files``: where a table's files live (a local folder or a bucket) and how each engine
  reaches them;
- ``writer``: pgsub's own Delta writer - commits, deletion vectors, log replay - which
  never imports Spark;
- ``spark``: Spark's door - the session, SQL written once, the MERGE writers, table
  definitions, maintenance;
- the modules here, on top: the target tables as the worker sees them (``tables``: the
  ``apply.plans.tables.Tables`` seam), the state store under ``_pgsub/``
  (``state_store``), the initial copy (``copy``), which engine writes a table
  (``placement``), commit marks (``marks``), the change log's and messages' appends
  (``appends``), a versions table's writes (``versions``) and the options tables are
  made with (``table_options``).

Spark Delta operations are SQL or DataFrames, so a local Spark, a cluster and a Spark
Connect server take the same path.
"""
