"""Transactions as they arrive from the stream, before a batch takes them.

Protocol messages assembled into transactions (``assembly``), the queue between the
receiver and the worker (``queue``), and the spool: transactions too large for memory or
streamed in progress, written to local files (``spool``, ``spool_frames``,
``spooled_piece``, ``spool_layout``) and large ones staged for their MERGE while they
arrive (``prestage``). Imports: ``apply.plans`` and down.
"""
