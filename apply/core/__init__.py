"""The apply worker's vocabulary: what every stage speaks, importing nothing of apply.

Remote transactions and their changes (``transactions``), a batch and what its write
returns (``batch``, ``records``), the errors (``errors``), who runs the loop - the leader or
a sync worker's catch-up (``roles``) - and the small policies every stage reads: table
features (``features``), maintenance (``maintenance_policy``), retry backoff (``backoff``),
failpoints for the crash tests (``failpoints``), a change rendered for a log line
(``rendering``). Imports: nothing of apply but itself.
"""
