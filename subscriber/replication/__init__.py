"""PostgreSQL's logical replication protocol, and nothing of Delta.

Every connection to a publisher (``session``), the replication commands
and the slot, the stream with its keepalives and status updates, the
pgoutput decoder (one message at a time, or runs of row changes a column at
a time), LSNs and the publisher's catalog (docs/stream.md).
"""
