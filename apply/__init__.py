"""The apply worker: remote transactions to Delta commits, exactly once.

Its rooms by stage, bottom to top; each imports only the ones below it (a layers contract
of ``.importlinter``; docs/architecture.md, "Rooms"):

- ``core``: the vocabulary - transactions, a batch, write records, errors, roles, policies;
- ``columns``: PostgreSQL's types as Delta's, a change's columns as Arrow;
- ``batching`` | ``schema_changes``: the batch as it forms and nets | DDL at its LSN;
- ``history``: change log, versions, stamps;
- ``plans``: what a batch becomes (MERGE plans, staging, rewrites) and the ``Tables`` seam;
- ``arrival`` | ``delta``: transactions as they arrive (assembly, queue, spool) | the
  Delta tables, which the process wires in;
- ``worker``: the loop - a batch taken, written, confirmed.

``core`` to ``history`` take values and return values; ``plans`` stages large
transactions and ``arrival`` spools them, in local files; only ``delta`` touches a table.
"""
