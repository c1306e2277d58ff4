"""The protocol lane's teeth, measured: mutmut (pyproject.toml's ``[tool.mutmut]``) mutates the store protocol's code
(sync/protocol.py, lease.py, bucket_store.py, read.py, committer.py), and runs the protocol lane
(tests/unit/test_protocol_sim.py, ``--histories`` generated histories per mutant) against each mutant.

    python -m bench.mutation [--files protocol lease ...] [--histories 80] [--max-children 2] [--report-only] [--json]

Prints ``{"killed": K, "total": N, "survivors": [{"mutant": ..., "why": ...}]}``: a mutant is killed when a test
fails on it (or it runs out of time); a survivor's ``why`` comes from the reviewed list bench/mutation_survivors.json
(why it is equivalent or harmless), else "not reviewed". ``mutmut show <mutant>`` prints one's diff. The run takes
long (about 4 s of CPU per mutant on a 2-core machine: docs/testing.md); mutmut resumes where it stopped, and
``--report-only`` reads what the runs so far found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("protocol", "lease", "bucket_store", "read", "committer")
REVIEWED = Path(__file__).parent / "mutation_survivors.json"
RESULT = Path(__file__).parent / "results" / "mutation.json"
KILLED = {1, 3, 36, -24, 24, 152, 255, 37}  # mutmut's exit codes of a killed mutant (a timeout counts)
NO_TESTS = {5, 33}


def run(files: list[str], histories: int, children: int) -> int:
    env = {**os.environ, "PROTOCOL_SIM_HISTORIES": str(histories)}
    globs = [f"entrypoint.sync.{name}.*" for name in files]
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *globs]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def report(files: list[str]) -> dict[str, object]:
    reviewed = json.loads(REVIEWED.read_text()) if REVIEWED.is_file() else {}
    killed, total, survivors, unchecked = 0, 0, [], 0
    for name in files:
        meta = ROOT / "mutants" / "entrypoint" / "sync" / f"{name}.py.meta"
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
        for mutant, code in sorted(codes.items()):
            if code is None:
                unchecked += 1
                continue
            total += 1
            if code in KILLED:
                killed += 1
                continue
            why = reviewed.get(mutant) or ("no test of the protocol lane reaches it" if code in NO_TESTS else None)
            survivors.append({"mutant": mutant, "why": why or "not reviewed"})
    return {"killed": killed, "total": total, "not_checked": unchecked, "files": files, "survivors": survivors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(FILES))
    parser.add_argument("--histories", type=int, default=80, help="generated histories per mutant")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="report what the runs so far found")
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    args = parser.parse_args(argv)
    if not args.report_only:
        run(args.files, args.histories, args.max_children)
    result = report(args.files)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    if not args.json:
        total = result["total"] or 1
        print(f"killed {result['killed']} of {result['total']} ({100 * int(result['killed']) // int(total)} %)")
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
