"""A lease file as a person may leave it."""

from __future__ import annotations

import json

# The message of a commit a person makes: what it leaves is no container's take (tests/protocol_sim/oracle.py).
PERSON_EDIT = "a person edits the lease"


def garbage_lease() -> bytes:
    """What a person's edit may leave: JSON that is not a lease."""
    return b'{"note": "edited by hand"}\n'


def absurd_lease() -> bytes:
    """A lease a person wrote by hand: its period in milliseconds (33 hours, read as seconds), naming an attempt
    no container runs."""
    body = {"format": 1, "run_id": "unknown", "holder": "0000000000001-dead00", "taken_at": 0, "period": 120000}
    return json.dumps(body).encode()
