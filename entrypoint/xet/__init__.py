"""Xet: a commit's large files on their way to the repo's Xet storage, outside the agent's own memory.

``child`` sends a commit's large files from a child process (``python -m entrypoint.xet.child``), so the
agent's memory stays flat; ``ahead`` streams a large checkpoint to the same child while it is being staged,
for the commit to name once it is checked. The transfer machinery under ``hub.py``'s commits: it builds on
the foundations only, and no other wing is imported here.
"""
