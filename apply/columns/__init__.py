"""Column values and types: PostgreSQL's types as Delta's, and a change's columns as Arrow.

The type map (``typemap``), binary-format decoding (``binary``), the target table's schema
and its evolution (``schema``), a change's columns as Arrow arrays (``columnar``) and the
columns a change carries, unchanged TOAST included (``change_columns``). Imports:
``apply.core``.
"""
