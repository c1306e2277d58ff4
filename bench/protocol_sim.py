"""The long lane of the store protocol's simulation: 100 000 generated histories (tests/protocol_world.py),
every invariant checked after every step. Writes bench/results/protocol_sim.json.

    python -m bench.protocol_sim [histories]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.protocol_world import Violation, run_history

RESULT = Path(__file__).parent / "results" / "protocol_sim.json"


def main(count: int = 100_000) -> int:
    began = time.monotonic()
    failures: list[str] = []
    for seed in range(count):
        try:
            run_history(seed)
        except Violation as error:
            failures.append(str(error))
            print(error, file=sys.stderr)
    result = {
        "histories": count,
        "violations": len(failures),
        "seconds": round(time.monotonic() - began, 1),
        "first_violation": failures[0].splitlines()[0] if failures else None,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
