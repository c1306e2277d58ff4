"""Job: the two stages of ``pipeline.Job`` that drive several wings, above them all and below the entry points.

``loop`` is the training stage (``TrainingLoop``: the trainer started, watched with the sync, the stop rule and the
progress line, healed in place after an out-of-memory); ``wrapup`` is the job's end, whatever ended it
(``WrapUp``: its record, the deliverables, the final upload, the notice, then the release).
"""
