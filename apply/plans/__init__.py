"""What a batch's net changes become: the writes, planned as values.

The MERGE plans (``merge_plan``), large transactions staged as Parquet (``staging``), a
small table rewritten in Arrow (``rewrite``), and ``tables``: the seam the Delta target
implements (``Tables``), which the worker calls and tests replace. Imports: the stages
below (``apply.history`` and down).
"""
