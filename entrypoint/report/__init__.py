"""Report: what a person reads about a run: the progress line, the model card, its plot, the receipt.

``progress`` keeps the timeline, the estimate and the receipt; ``epochs`` renders the epoch line, ``page`` the
model card and its plot. Written for people, never read back by the agent to decide anything.
"""
