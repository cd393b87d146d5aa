"""pgsub: PostgreSQL's logical replication subscriber, applying into Delta Lake.

``subscriber.replication`` is the wire (pgoutput over a replication
connection), ``subscriber.runtime`` the process (CLI, daemon, config, HTTP),
``subscriber.metrics`` the Prometheus families. docs/architecture.md is the map.
"""

import os

# Arrow's allocator, mimalloc, gives a page it has freed back to the system at once; as
# pyarrow builds it, it kept what a batch had freed (after a 1M-row transaction about 100 MB
# held between batches, under the next one's peak). Read once, as pyarrow loads: set here,
# before any module of pgsub imports it (docs/performance.md, "Written by its keys'
# positions; freed memory given back").
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")

# pyarrow imports pandas at its first ``pa.array`` unless told it is not there: told here,
# before any module of pgsub makes one (subscriber/pyarrow_start.py).
from subscriber.pyarrow_start import without_pandas

without_pandas()
