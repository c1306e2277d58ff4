"""A stand-in for the raw-output check's child (``python -m entrypoint.evaluation.rawcheck``), for runs with the
stand-in libreyolo, whose files no runtime can load: no torch, it answers as the child does.

``install(bin_dir)`` writes it as ``bin_dir/rawcheck``; point ``TRAINBOX_RAW_CHECK`` at it. It takes the child's
arguments and prints its ``RESULT`` line: the export's raw outputs differ from best.pt's by ``FAKE_RAW_DIFF``
(default 0) everywhere, on a reference of zeros, so they are within when that is at most ``--atol``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RESULT = "TRAINBOX_RAW_OUTPUTS "


def install(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "rawcheck"
    script.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text())
    script.chmod(0o755)
    return script


def main(argv: list[str]) -> int:
    options: dict[str, list[str]] = {}
    key = ""
    for arg in argv:
        if arg.startswith("--"):
            key = arg[2:]
            options[key] = []
        else:
            options[key].append(arg)
    for needed in ("weights", "export", "format", "device", "atol", "rtol", "images"):
        if not options.get(needed):
            print(f"rawcheck: --{needed} is required", file=sys.stderr)
            return 2
    difference = float(os.environ.get("FAKE_RAW_DIFF", "0"))
    atol, rtol = float(options["atol"][0]), float(options["rtol"][0])
    record = {
        "images": len(options["images"]),
        "max_abs_diff": difference,
        "atol": atol,
        "rtol": rtol,
        "within": difference <= atol,
    }
    print(RESULT + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
