"""Benchmark: the extractor's memory on archives built to exhaust it.

Each archive is a .tgz of a few hundred KB, written to disk as a stream (never whole in memory)
and extracted by ``entrypoint.dataset.extract`` in a process of its own; its peak RSS is the kernel's
``ru_maxrss`` for that process (``wait4``). The baseline is the same process on an ordinary small
tar, so the difference is what the archive cost.

  pax header      one member whose PAX header holds --mib MiB (``tarfile`` reads a header whole)
  gnu long name   one GNU long-name header of --mib MiB
  content         one file of zeros 4 × --mib MiB, extracted with a cap of 64 MiB

Goal: every bomb refused with its error, peak RSS ≤ baseline + 32 MB. Writes
bench/results/header_bomb.json and prints a Markdown table for docs/benchmarks.md.
Run from the repository root: ``python -m bench.header_bomb [--mib 512]``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
EXTRACT = """\
import sys
from pathlib import Path
from entrypoint.dataset import extract
from entrypoint.errors import AgentError
cap = int(sys.argv[3]) or None
try:
    extract.extract(extract.read_file(Path(sys.argv[1])), Path(sys.argv[2]), max_bytes=cap)
    print("extracted")
except AgentError as error:
    print(f"{type(error).__name__} (exit {error.exit_code})")
"""


def ordinary_tail() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        member = tarfile.TarInfo("data.yaml")
        member.size = 11
        archive.addfile(member, io.BytesIO(b"names: [a]\n"))
    return buffer.getvalue()


def zeros(size: int, byte: bytes = b"\0") -> Iterator[bytes]:
    block = byte * MIB
    while size > 0:
        yield block[: min(size, MIB)]
        size -= MIB


def header(name: str, kind: bytes, size: int) -> bytes:
    member = tarfile.TarInfo(name)
    member.type, member.size = kind, size
    return member.tobuf(tarfile.USTAR_FORMAT if kind != tarfile.GNUTYPE_LONGNAME else tarfile.GNU_FORMAT)


def pad(size: int) -> bytes:
    return bytes(-size % 512)


def pax_bomb(mib: int) -> Iterator[bytes]:
    value = mib * MIB
    body = len(" comment=\n") + value
    length = body + len(str(body))
    length = body + len(str(length))  # the record's length counts its own digits
    yield header("././@PaxHeader", tarfile.XHDTYPE, length)
    yield f"{length} comment=".encode()
    yield from zeros(value, b"x")
    yield b"\n" + pad(length)
    yield ordinary_tail()


def gnu_long_name_bomb(mib: int) -> Iterator[bytes]:
    yield header("././@LongLink", tarfile.GNUTYPE_LONGNAME, mib * MIB)
    yield from zeros(mib * MIB, b"a")
    yield ordinary_tail()


def content_bomb(mib: int) -> Iterator[bytes]:
    yield header("zeros", tarfile.REGTYPE, 4 * mib * MIB)
    yield from zeros(4 * mib * MIB)
    yield ordinary_tail()


def ordinary(_: int) -> Iterator[bytes]:
    yield ordinary_tail()


def write(path: Path, parts: Iterator[bytes]) -> int:
    with gzip.open(path, "wb", compresslevel=9) as out:
        for part in parts:
            out.write(part)
    return path.stat().st_size


def measure(archive: Path, target: Path, cap: int, code: Path) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    child = subprocess.Popen(
        [sys.executable, "-c", EXTRACT, str(archive), str(target), str(cap)],
        cwd=code,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    verdict = child.stdout.read().strip()
    _, _, usage = os.wait4(child.pid, 0)  # the child's own peak, not the largest of all children
    child.returncode = 0
    return verdict, usage.ru_maxrss / 1024  # KiB → MiB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--code", type=Path, default=ROOT, help="the agent's code to measure (an older checkout)")
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[int], Iterator[bytes]], int]] = [
        ("ordinary tar (baseline)", ordinary, 0),
        ("pax header", pax_bomb, 0),
        ("gnu long name", gnu_long_name_bomb, 0),
        ("content, cap 64 MiB", content_bomb, 64 * MIB),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, build, cap) in enumerate(cases):
            archive = Path(scratch) / f"{index}.tgz"
            size = write(archive, build(args.mib))
            verdict, peak = measure(archive, Path(scratch) / f"out{index}", cap, args.code)
            rows.append({"archive": name, "tgz_bytes": size, "verdict": verdict, "peak_rss_mib": round(peak, 1)})
    baseline = rows[0]["peak_rss_mib"]
    result = {
        "mib": args.mib,
        "rows": rows,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    if args.code == ROOT:
        (ROOT / "bench" / "results").mkdir(exist_ok=True)
        (ROOT / "bench" / "results" / "header_bomb.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| archive | .tgz size | verdict | peak RSS | goal |\n|---|---|---|---|---|")
    for row in rows:
        goal = "" if row is rows[0] else f"≤ {baseline + 32:.0f} MiB"
        size = f"{row['tgz_bytes'] / 1024:.0f} KiB"
        print(f"| {row['archive']} | {size} | {row['verdict']} | {row['peak_rss_mib']} MiB | {goal} |")


if __name__ == "__main__":
    main()
