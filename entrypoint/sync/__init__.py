"""Sync: every epoch boundary of the run folder on the Hub, never torn, never lost.

The uploader watches the run folder, stages a consistent snapshot, checks each checkpoint
(``checkpoint``) and commits it; ``bucket`` and ``places`` keep the working state in a Storage Bucket
beside the model repo.
"""
