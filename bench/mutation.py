"""The protocol lane's teeth, measured: mutmut (pyproject.toml's ``[tool.mutmut]``) mutates the store protocol's code
(sync/protocol.py, lease.py, bucket_store.py, read.py, committer.py), and runs the protocol lane (``-m protocol``:
the simulation with ``--histories`` generated histories, the fences, lease, bucket store and commit budget tests)
against each mutant: only the lane's tests that reach the mutated function.

    python -m bench.mutation [--files protocol lease ...] [--histories 80] [--max-children 2] [--again MUTANT ...]
                             [--report-only] [--json]

Prints ``{"killed": K, "total": N, "survivors": [{"mutant": ..., "why": ...}]}``: a mutant is killed when a test
fails on it (or it runs out of time); a survivor's ``why`` comes from the reviewed list bench/mutation_survivors.json
(why it is equivalent or harmless), else "not reviewed". ``mutmut show <mutant>`` prints one's diff. The run takes
long (seconds of CPU per mutant: docs/testing.md); a run resumes where the last one stopped (``--again``: mutants
checked anew, after a new test), and ``--report-only`` reads what the runs so far found.
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


def run(files: list[str], histories: int, children: int, again: list[str]) -> int:
    """mutmut runs again every mutant it is given by name: a run that resumes names only the mutants not checked
    yet (and those of ``again``, checked anew against the tests as they are now)."""
    env = {**os.environ, "PROTOCOL_SIM_HISTORIES": str(histories)}
    todo = [*again, *(mutant for name in files for mutant, code in _codes(name).items() if code is None)]
    if not todo and not any(_codes(name) for name in files):
        todo = [f"entrypoint.sync.{name}.*" for name in files]  # nothing generated yet: all of them
    if not todo:
        return 0
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *todo]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def _codes(name: str) -> dict[str, int | None]:
    """mutmut's verdict (an exit code; None: not checked yet) of each mutant of sync/``name``.py."""
    meta = ROOT / "mutants" / "entrypoint" / "sync" / f"{name}.py.meta"
    return dict(json.loads(meta.read_text())["exit_code_by_key"]) if meta.is_file() else {}


def report(files: list[str]) -> dict[str, object]:
    reviewed = json.loads(REVIEWED.read_text()) if REVIEWED.is_file() else {}
    survivors: list[dict[str, str]] = []
    by_file: dict[str, dict[str, int]] = {}
    for name in files:
        counts = by_file[name] = {"killed": 0, "total": 0, "not_checked": 0, "no_tests": 0}
        for mutant, code in sorted(_codes(name).items()):
            if code is None:
                counts["not_checked"] += 1
                continue
            counts["total"] += 1
            if code in KILLED:
                counts["killed"] += 1
                continue
            counts["no_tests"] += code in NO_TESTS
            why = reviewed.get(mutant) or ("no test of the protocol lane reaches it" if code in NO_TESTS else None)
            survivors.append({"mutant": mutant, "why": why or "not reviewed"})
    return {
        **{key: sum(counts[key] for counts in by_file.values()) for key in ("killed", "total", "not_checked")},
        "files": files,
        "by_file": by_file,
        "survivors": survivors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", choices=FILES, default=list(FILES))
    parser.add_argument("--histories", type=int, default=80, help="generated histories per mutant")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="report what the runs so far found")
    parser.add_argument(
        "--again", nargs="+", default=[], help="mutants (or globs) to check anew, e.g. after a new test"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    args = parser.parse_args(argv)
    if not args.report_only:
        run(args.files, args.histories, args.max_children, args.again)
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
