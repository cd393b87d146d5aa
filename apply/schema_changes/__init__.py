"""Schema changes at their LSN: DDL announced by the publisher, followed in the tables.

The DDL messages of ``pgsub publisher-setup``'s event triggers parsed and planned (``ddl``)
and the follower that turns a batch's schema changes into table definitions
(``schema_follower``). Imports: ``apply.columns``, ``apply.core``.
"""
