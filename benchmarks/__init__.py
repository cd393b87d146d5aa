"""Benchmarks: each scenario of ``make bench*`` run beside PostgreSQL's own subscriber on the
same publisher, in the same run (docs/performance.md). They measure; they assert nothing.

``harness`` starts the publisher, the native subscriber and pgsub and samples the lag at the
slot; each other module is one scenario (``suite`` runs them all for ``make bench``).
"""

import subscriber  # noqa: F401 - Arrow's allocator settings, made before pyarrow loads
