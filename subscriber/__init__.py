"""pgsub: PostgreSQL's logical replication subscriber, applying into Delta Lake.

``subscriber.replication`` is the wire (pgoutput over a replication
connection), ``subscriber.runtime`` the process (CLI, daemon, config, HTTP),
``subscriber.metrics`` the Prometheus families. docs/architecture.md is the map.
"""
