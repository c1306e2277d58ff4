"""Sync: every epoch boundary of the run folder in its stores, never torn, never lost; and where the newest copy is.

``uploader`` (``Uploader``: start, flush, stop) holds one ``snapshot.Snapshotter`` (each boundary's changed
files staged once by ``staging.Stager``, checked by ``checkpoint``) and one ``lane.Lane`` per store, whose
committer thread (``committer``) writes through the ``stores.Store`` protocol: the model repo
(``stores.RepoStore``) and the Storage Bucket (``bucket_store.BucketStore`` over ``bucket``'s layout and
manifests); ``places`` says which store takes
which file, and when the repo takes the working state of a failing bucket; ``ledger`` remembers what each
store holds and the commit budget; ``watcher`` wakes the snapshots and tells when training has ended.
``protocol`` holds the store protocol's decisions apart from I/O (resume, what a manifest names, what may
be deleted, the lease, the fallback); ``lease`` takes and keeps the run's lease (one writer per run).
``read`` is the one read side: the newest valid copy of the run across the volume, the bucket and the
repo, and the newest trainbox.json. ``job`` is what the job asks of the sync; ``mirror`` is the loop
``trainbox sync`` runs. Nothing here imports the training wing.
"""
