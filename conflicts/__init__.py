"""Conflicts in PostgreSQL's terms: the kinds, how a change is judged, what is reported.

Vocabulary that both the pure apply core and the Delta writers speak, below
``apply``: kinds and resolutions, findings, the reports worded as
PostgreSQL's subscriber words them, and the reporter that logs, counts and
stores them (docs/conflicts.md).
"""
