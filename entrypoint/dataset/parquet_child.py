"""The parquet conversion in a child process: pyarrow (about 80 MB once imported) and the row group being read
live there, not in the agent, whose memory stays that of the download beside it (bench/parquet_dataset.py).

The agent downloads the files (the next while the child converts the current one) and hands each over on the
child's stdin as one JSON line; the child answers ``{"done": ...}`` per file, and once stdin closes, the
report or the refusal (``{"error": {"type", "message", "hint"}}``), rebuilt here as the same ``AgentError``.
The child's log lines go to the agent's stderr; it gets no token (it reads local files only).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .. import errors, procs
from ..errors import AgentError, DatasetError, ParquetRuntimeError
from ..parsing import BoxFormat
from ..runtimes import fetch as runtimes
from .extract import ExtractReport
from .parquet import Download, Prefetch, _Converter

if TYPE_CHECKING:  # the child does not import the settings
    from ..settings import Settings

_STOP_GRACE = 2.0


def fetch_pyarrow(settings: Settings) -> None:
    """pyarrow, which the image leaves out (170 MB), installed on the volume the first time a parquet dataset
    is met (``runtimes``); a failure is exit 48 naming the fix."""
    try:
        runtimes.ensure(runtimes.PARQUET, settings.workdir, settings.env)
    except runtimes.FetchFailed as error:
        raise ParquetRuntimeError(
            f"a parquet dataset needs {', '.join(runtimes.PARQUET.wheels)}, and fetching it failed: {error}",
            "let the container reach PyPI (or set PIP_INDEX_URL/PIP_FIND_LINKS), build the image with"
            " --build-arg TRAINBOX_RUNTIMES=parquet, or publish the dataset as a .tar of YOLO or COCO files",
        ) from None


def convert_in_child(
    train: list[str],
    validation: list[str],
    download: Download,
    scratch: Path,
    folder: Path,
    *,
    bbox: BoxFormat,
    readme: str | None,
    max_bytes: int | None,
    test: Sequence[str] = (),
) -> ExtractReport:
    """``parquet.convert``, the reading done by a child process."""
    jobs = [("train", path) for path in train] + [("val", path) for path in validation]
    jobs += [("test", path) for path in test]
    scratch.mkdir(parents=True, exist_ok=True)
    config = {"folder": str(folder), "bbox": bbox.value, "readme": readme, "max_bytes": max_bytes}
    env = {key: value for key, value in runtimes.child_env(procs.scrubbed_env()).items() if key != "HF_TOKEN"}
    child = procs.Child(
        [sys.executable, "-m", "entrypoint.dataset.parquet_child", json.dumps(config)],
        cwd=Path(__file__).resolve().parents[2],  # the folder that holds this package: the child runs this code
        env=env,
        errors=sys.stderr.fileno(),
        stdin=subprocess.PIPE,
        echo=False,
        label="parquet conversion",
    )
    assert child.process.stdin is not None and child.process.stdout is not None
    try:
        pending = Prefetch(download, jobs[0][1], scratch / "00000.parquet")
        for index, (split, path) in enumerate(jobs):
            local = pending.result()
            if index + 1 < len(jobs):  # the next file downloads while the child converts this one
                pending = Prefetch(download, jobs[index + 1][1], scratch / f"{index + 1:05d}.parquet")
            _send(child.process.stdin, {"local": str(local), "shown": path, "split": split})
            _answer(child.process.stdout, child)
        child.process.stdin.close()
        report = _answer(child.process.stdout, child)["report"]
        child.wait(timeout=30)
        return ExtractReport(**report)
    finally:
        if child.poll() is None:
            child.stop(signal.SIGTERM, grace=_STOP_GRACE)
        child.process.stdout.close()


def _send(pipe: IO[bytes], message: dict[str, Any]) -> None:
    pipe.write(json.dumps(message).encode() + b"\n")
    pipe.flush()


def _answer(pipe: IO[bytes], child: procs.Child) -> dict[str, Any]:
    line = pipe.readline()
    if not line:
        raise DatasetError(
            f"the parquet conversion ended without an answer (exit {child.wait(timeout=30)})",
            "see the lines above; run `trainbox fetch` again",
        )
    answer: dict[str, Any] = json.loads(line)
    if "error" in answer:
        kind = getattr(errors, answer["error"]["type"], DatasetError)
        kind = kind if isinstance(kind, type) and issubclass(kind, AgentError) else DatasetError
        raise kind(answer["error"]["message"], answer["error"]["hint"])
    return answer


def main() -> int:
    from ..log import setup

    setup()
    config = json.loads(sys.argv[1])
    converter = _Converter(Path(config["folder"]), BoxFormat(config["bbox"]), config["readme"], config["max_bytes"])
    out = sys.stdout
    try:
        Path(config["folder"]).mkdir(parents=True)
        for line in sys.stdin:
            job = json.loads(line)
            converter.file(Path(job["local"]), job["shown"], job["split"])
            Path(job["local"]).unlink(missing_ok=True)
            out.write(json.dumps({"done": job["shown"]}) + "\n")
            out.flush()
        report = converter.finish()
        out.write(json.dumps({"report": vars(report)}) + "\n")
        return 0
    except AgentError as error:
        out.write(json.dumps({"error": {"type": type(error).__name__, "message": error.message, "hint": error.hint}}))
        out.write("\n")
        return 1
    finally:
        out.flush()
        converter.close()


if __name__ == "__main__":
    raise SystemExit(main())
