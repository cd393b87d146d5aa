"""Spark's door: the only package that imports pyspark, delta, py4j or deltalake.

The target tables (``tables``, ``target``, ``definition``), their writers
(``keyed``, ``multiset``, ``copy``, ``staged_copy``), the state store under
``_pgsub/`` (``state_store``), maintenance, and the Spark session itself
(``session``). Spark Delta operations are SQL or DataFrames, so a local
Spark, a cluster and a Spark Connect server take the same path.
"""
