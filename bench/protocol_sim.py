"""The long lane of the store protocol's simulation (tests/protocol_sim): the agent's own lease, bucket, read and
committer code against an in-memory Hub in virtual time, every invariant judged after every step.

    python -m bench.protocol_sim [--histories N] [--seed S] [--json]

Histories are seeds S .. S+N-1. A violation prints its seed, what broke and the last events; replay it alone with
``python -m bench.protocol_sim --histories 1 --seed <seed>`` (or ``tests.protocol_sim.world.run(<seed>)`` under a
debugger): a history replays exactly from its seed. Writes bench/results/protocol_sim.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tests.protocol_sim.world import Violation, run

RESULT = Path(__file__).parent / "results" / "protocol_sim.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the result as JSON")
    args = parser.parse_args(argv)
    began, cpu = time.monotonic(), time.process_time()
    violations: list[dict[str, object]] = []
    steps = 0
    for seed in range(args.seed, args.seed + args.histories):
        try:
            steps += run(seed).steps
        except Violation as error:
            violations.append({"seed": seed, "why": str(error).splitlines()[0]})
            if not args.json:
                print(f"{error}\nreplay: python -m bench.protocol_sim --histories 1 --seed {seed}\n", file=sys.stderr)
    wall, cpu = time.monotonic() - began, time.process_time() - cpu
    result = {
        "histories": args.histories,
        "first_seed": args.seed,
        "violations": violations,
        "steps": steps,
        "seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "histories_per_cpu_second": round(args.histories / cpu, 1) if cpu else None,
    }
    if args.histories >= 1000:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
