"""The long lane of the store protocol's simulation (tests/protocol_sim): the agent's own lease, bucket, read and
committer code against an in-memory Hub in virtual time, every invariant judged after every step.

    python -m bench.protocol_sim [--histories N] [--seed S] [--workers W] [--json]

Histories are seeds S .. S+N-1, played by W processes (each every W-th seed; default 1). A violation prints its
seed, what broke and the last events; replay it alone with
``python -m bench.protocol_sim --histories 1 --seed <seed>`` (or ``tests.protocol_sim.world.run(<seed>)`` under a
debugger): a history replays exactly from its seed. Writes bench/results/protocol_sim.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tests.protocol_sim.world import Violation, run

RESULT = Path(__file__).parent / "results" / "protocol_sim.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes, each playing every W-th seed")
    parser.add_argument("--json", action="store_true", help="print only the result as JSON")
    args = parser.parse_args(argv)
    began = time.monotonic()
    seeds = range(args.seed, args.seed + args.histories)
    slices = [(seeds[n :: args.workers], args.json) for n in range(args.workers)]
    with ProcessPoolExecutor(args.workers) as pool:
        played = list(pool.map(_play, slices))
    violations = sorted((v for found, _, _ in played for v in found), key=lambda v: int(str(v["seed"])))
    steps, cpu = sum(n for _, n, _ in played), sum(c for _, _, c in played)
    wall = time.monotonic() - began
    result = {
        "histories": args.histories,
        "first_seed": args.seed,
        "violations": violations,
        "steps": steps,
        "seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "workers": args.workers,
        "histories_per_cpu_second": round(args.histories / cpu, 1) if cpu else None,
    }
    if args.histories >= 1000:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 1 if violations else 0


def _play(work: tuple[range, bool]) -> tuple[list[dict[str, object]], int, float]:
    """One process's seeds: its violations, steps and CPU seconds."""
    seeds, quiet = work
    cpu = time.process_time()
    violations: list[dict[str, object]] = []
    steps = 0
    for seed in seeds:
        try:
            steps += run(seed).steps
        except Violation as error:
            violations.append({"seed": seed, "why": str(error).splitlines()[0]})
            if not quiet:
                print(f"{error}\nreplay: python -m bench.protocol_sim --histories 1 --seed {seed}\n", file=sys.stderr)
    return violations, steps, time.process_time() - cpu


if __name__ == "__main__":
    sys.exit(main())
