"""The apply loop, on top: where a batch is taken, written, confirmed.

``worker`` (``ApplyWorker``: the loop, the batch in flight, the flush confirmation),
``worker_hooks`` (what the leader and a sync worker's catch-up each do at its steps),
``applier`` (one batch: schema changes, nets, writes, verification), ``whole`` (a
transaction too large for a batch, written from the spool) and ``pipeline`` (the pieces
wired for one role). Imports: every other stage; ``apply.delta`` only through the seams
(``apply.plans.tables``).
"""
