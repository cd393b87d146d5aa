"""The batch as it forms and nets: transactions in, one net change per key out.

Forming batches from the queue (``forming``), netting each table's changes per key
(``collapse``) and per column (``columns_net``), the MERGE sources they become (``source``,
``copy_source``), what conflict resolutions keep (``resolve``), and conflicts reported in
PostgreSQL's words (``conflict_handling``, ``error_context``). Imports: ``apply.columns``,
``apply.core``.
"""
