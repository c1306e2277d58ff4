"""Sync: every epoch boundary of the run folder on the Hub, never torn, never lost.

``uploader`` (``Uploader``: start, flush, stop; its docstring states the threads, the lock and what each
call promises) is the committer over ``snapshot``, which stages each boundary's changed files through
``staging`` (private copies, hashed, scrubbed of secrets) and ``checkpoint`` (each ``.pt`` checked
before it goes); ``ledger`` remembers what the Hub holds and the commit budget; ``watcher`` wakes the
snapshots and tells when training has ended; ``mirror`` is the loop ``trainbox sync`` runs. ``bucket``
and ``places`` keep the working state in a Storage Bucket beside the model repo; ``job`` is what the
job asks of the sync (start it after resume, the final upload, whether the Hub holds everything).
"""
