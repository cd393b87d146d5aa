"""The apply worker: remote transactions to Delta commits, exactly once.

A pure core (transactions, assembly, spool, batch, collapse, typemap,
schema, source, merge plan, resolve) that takes values and returns values,
and the apply loop that drives it (``worker``, ``pipeline``, ``roles``,
``applier``). Delta and Spark are reached only through ``apply.delta``,
which the process wires in (docs/architecture.md).
"""
