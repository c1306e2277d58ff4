"""Which data.yaml, and ``libreyolo doctor`` on it: inline, or beside the start of training."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .. import libreyolo, procs
from ..errors import AmbiguousDataYamlError, DatasetInvalidError, DataYamlNotFoundError
from ..log import logger
from ..settings import Settings
from ..state import write_json_atomic

DOCTOR_TIMEOUT = 30 * 60.0
_DOCTOR_MARKER = ".trainbox-doctor.json"
# Checks noted instead of run, for ``DatasetCheck``: fingerprint → (data.yaml, imgsz, the dataset's own root).
Deferred = dict[str, tuple[Path, int, Path | None]]


def locate_data_yaml(root: Path, wanted: str | None, candidates: Sequence[str] | None = None) -> Path:
    """``DATA_YAML`` (relative to the root) or the only data.yaml in the tree.

    ``candidates`` (relative paths, e.g. noted while extracting) saves walking a large tree.
    """
    if wanted is not None:
        candidate = (root / wanted).resolve()
        if not candidate.is_relative_to(root.resolve()) or not candidate.is_file():
            raise DataYamlNotFoundError(
                f"DATA_YAML={wanted} is not a file in the dataset", "give a path relative to its root"
            )
        return candidate
    if candidates is not None:
        found = sorted({root / name for name in candidates})  # a member twice in a tar is one file
    else:
        found = sorted(path for path in root.rglob("*.yaml") if path.name in {"data.yaml", "dataset.yaml"})
    if not found:
        raise DataYamlNotFoundError(f"no data.yaml in {root}", "add one (YOLO format), or set DATA_YAML")
    if len(found) > 1:
        listed = ", ".join(str(path.relative_to(root)) for path in found[:5])
        raise AmbiguousDataYamlError(f"several data.yaml files: {listed}", "choose one with DATA_YAML")
    return found[0]


def doctor(
    data_yaml: Path,
    *,
    imgsz: int,
    fingerprint: str,
    defer_to: Deferred | None = None,
    command: str | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """Run ``libreyolo doctor``; stop on its errors. Skipped when this exact data already passed. ``root``:
    the dataset's own folder, which messages name paths relative to.

    ``defer_to``: note the check there instead of running it (``{}`` is returned), to run beside the
    start of training (``prepare_checked_in_background``)."""
    marker = data_yaml.parent / _DOCTOR_MARKER
    fingerprint = f"{fingerprint}:imgsz={imgsz}"  # the check depends on the image size too
    try:
        cached = json.loads(marker.read_text())
        if isinstance(cached, dict) and cached.get("fingerprint") == fingerprint and isinstance(cached["report"], dict):
            logger.info("dataset check: passed before, not repeated")
            return cached["report"]
    except (OSError, ValueError, KeyError):
        pass
    if defer_to is not None:  # started once the data is in place
        defer_to[fingerprint] = (data_yaml, imgsz, root)  # the last place wins: a staging folder is renamed
        return {}
    result = procs.run(_doctor_argv(data_yaml, imgsz, command), timeout=DOCTOR_TIMEOUT, cwd=data_yaml.parent)
    if result.timed_out or result.returncode is None:
        raise DatasetInvalidError(
            f"libreyolo doctor did not finish in {DOCTOR_TIMEOUT / 60:.0f} min",
            "check the data.yaml (libreyolo doctor)",
        )
    return _doctor_verdict(result.returncode, result.stdout, result.stderr, marker, fingerprint, root)


def _doctor_argv(data_yaml: Path, imgsz: int, command: str | None) -> list[str]:
    return [libreyolo.executable(command), "doctor", str(data_yaml), "--imgsz", str(imgsz), "--json"]


def _doctor_verdict(
    returncode: int, stdout: str, stderr: str, marker: Path, fingerprint: str, root: Path | None = None
) -> dict[str, Any]:
    """Log doctor's warnings, raise on its errors (a path named relative to ``root``, the dataset's own);
    remember a pass in ``marker``."""
    try:
        report = json.loads(stdout)
        if not isinstance(report, dict):  # not doctor's report: told like unreadable output
            raise ValueError("not a JSON object")
    except ValueError:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise DatasetInvalidError(f"libreyolo doctor failed: {tail}", "check the data.yaml") from None
    findings = report.get("findings", [])
    for finding in findings:
        if finding.get("severity") == "warning":
            logger.warning("dataset check: %s", finding.get("message"))
    problems = [finding for finding in findings if finding.get("severity") == "error"]
    if returncode != 0 or problems:
        first = problems[0] if problems else {"message": f"exit code {returncode}"}
        paths = first.get("paths") or []
        where = f" ({_shown(str(paths[0]), root)})" if paths else ""
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise DatasetInvalidError(
            f"the dataset check found errors: {first.get('message')}{where}{more}",
            "fix the dataset; run `libreyolo doctor <data.yaml>` to see every finding",
        )
    summary = report.get("summary", {})
    logger.info("dataset check: %s errors, %s warnings", summary.get("errors", 0), summary.get("warnings", 0))
    write_json_atomic(marker, {"fingerprint": fingerprint, "report": report})
    return report


def _shown(path: str, root: Path | None) -> str:
    """A path doctor names, as the dataset names it (never a staging or cache folder of the volume)."""
    if root is not None:
        with contextlib.suppress(ValueError):
            return Path(path).resolve().relative_to(root.resolve()).as_posix()
    return path


# -- the check beside the training's start ---------------------------------------------------------
# `libreyolo doctor` spends most of its ~5 s importing torch and libreyolo, as the training child does
# when it starts: run side by side, a cold start is not delayed by the check, and training is stopped
# at once if the check fails. prepare_checked_in_background() has doctor() note what to check (``defer_to``).


class DatasetCheck:
    """``libreyolo doctor`` running in the background on data in its final place."""

    def __init__(self, wanted: Mapping[str, tuple[Path, int, Path | None]], command: str | None = None) -> None:
        self._deadline = time.monotonic() + DOCTOR_TIMEOUT
        self._files = contextlib.ExitStack()  # the children's output, read once they exit
        self._runs: list[tuple[procs.Child, IO[bytes], IO[bytes], Path, str, Path | None]] = []
        try:
            for fingerprint, (data_yaml, imgsz, root) in wanted.items():
                argv = _doctor_argv(data_yaml, imgsz, command)
                logger.info("+ %s (beside the start of training)", " ".join(argv))
                # files, not pipes: a long report must not block the child while nobody reads; closed by cancel()
                out = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
                err = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
                process = procs.Child(argv, cwd=data_yaml.parent, output=out, errors=err, echo=False)
                self._runs.append((process, out, err, data_yaml.parent / _DOCTOR_MARKER, fingerprint, root))
        except BaseException:
            self.cancel()  # a second check that cannot start must not leave the first one running
            raise

    def done(self) -> bool:
        return time.monotonic() > self._deadline or all(run[0].poll() is not None for run in self._runs)

    def result(self) -> None:
        """Wait for the verdict; raise what ``doctor`` raises."""
        try:
            for process, out, err, marker, fingerprint, root in self._runs:
                try:
                    code = process.wait(timeout=max(0.0, self._deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise DatasetInvalidError(
                        f"libreyolo doctor did not finish in {DOCTOR_TIMEOUT / 60:.0f} min", "check the dataset"
                    ) from None
                out.seek(0)
                err.seek(0)
                stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
                _doctor_verdict(code, stdout, stderr, marker, fingerprint, root)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop what still runs (the job ends early) and let go of the output files."""
        for process, *_ in self._runs:
            if process.poll() is None:
                process.stop(signal.SIGKILL, grace=0.0)  # bounded: a child stuck in the kernel is left behind
        self._files.close()


def imgsz_of(settings: Settings) -> int:
    value = settings.run_args.get("imgsz") or "640"
    try:
        return max(int(part) for part in value.lower().replace("x", ",").split(",") if part.strip())
    except ValueError:
        return 640
