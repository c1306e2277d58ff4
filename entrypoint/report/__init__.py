"""Report: what a person reads about a run: the progress line, the model card, its plot, the receipt.

Written for people, never read back by the agent to decide anything.
"""
