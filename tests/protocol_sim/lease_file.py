"""A lease file as a person may leave it."""

from __future__ import annotations


def garbage_lease() -> bytes:
    """What a person's edit may leave: JSON that is not a lease."""
    return b'{"note": "edited by hand"}\n'
