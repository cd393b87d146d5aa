"""History modes: what a table keeps of its rows' past (docs/tables.md, "History").

A change log (``changelog``), SCD type 2 versions (``versions``), and the soft-delete and
commit stamps a row carries (``stamps``). Imports: ``apply.batching``, ``apply.columns``,
``apply.core``.
"""
