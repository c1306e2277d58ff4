"""Runs in a child process: the only code of the agent that touches CUDA.

Prints one JSON object on stdout describing the GPUs it was asked about, then exits, so the
CUDA context (and its memory on every card) is gone before training starts.
"""

from __future__ import annotations

import json
import sys


def probe(indices: list[int] | None) -> dict:
    import torch

    report: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    if not torch.cuda.is_available():
        report["available"] = False
        return report
    report["available"] = True
    count = torch.cuda.device_count()
    for index in indices if indices is not None else range(count):
        if index >= count:
            report["gpus"].append({"index": index, "error": f"no GPU {index} (this machine has {count})"})
            continue
        name = torch.cuda.get_device_name(index)
        report["gpus"].append({"index": index, "name": name})
    return report


def main() -> None:
    indices = [int(arg) for arg in sys.argv[1].split(",")] if len(sys.argv) > 1 and sys.argv[1] else None
    print(json.dumps(probe(indices)), flush=True)


if __name__ == "__main__":
    main()
