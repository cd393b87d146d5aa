"""Where a table's files live and how bytes reach them: a local folder or an object store.

``storage``: how each engine reaches an object store (endpoint, region, credentials: one
``Storage`` for delta-rs, obstore, pyarrow and Spark's S3A). ``store``: a table's files
behind one protocol (``TableStore``) - a local folder (fsynced, a commit put by
``os.link``) or a bucket (obstore, a commit put by a conditional PUT). ``store_check``: the
probe at start that a store refuses a second conditional PUT. Imports no engine but
obstore and pyarrow.
"""
