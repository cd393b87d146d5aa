"""Table synchronization: each table's copy under a slot's snapshot, INIT ... READY.

The leader's coordinator (``coordinator``: the state machine of
``state``, REFRESH's plan in ``refresh``), the sync worker (``worker``:
copy, catch-up, hand-over) and the copy's readers, in one stream or in
CTID ranges that a killed run resumes (docs/tablesync.md).
"""
