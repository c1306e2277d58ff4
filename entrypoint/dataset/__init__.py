"""Dataset stage: get the data onto the volume, find its data.yaml, and have libreyolo check it.

Sources: the bundled demo (generated), a local folder holding a data.yaml, a local tar, or a
Hugging Face dataset repo holding the dataset as one tar (``dataset.hub``).

A tar is extracted by ``extract`` (checked member by member) into a staging folder beside its
final one; the folder is renamed into place once extraction and ``libreyolo doctor`` succeeded,
and a marker written only then lets a restart on the same volume skip the work.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import yaml

from .. import procs
from ..errors import (
    AmbiguousDataYamlError,
    CrashLoopError,
    DatasetInvalidError,
    DatasetNotFoundError,
    DataYamlNotFoundError,
    DiskSpaceError,
)
from ..log import logger
from ..run_args import RunArgs
from ..settings import DatasetKind, Settings
from ..state import now_iso, write_json_atomic
from ..training import libreyolo_executable
from . import demo, extract

DOCTOR_TIMEOUT = 30 * 60.0
_DOCTOR_MARKER = ".trainbox-doctor.json"
# Extractions of the same archive cut short without a word (the agent killed: out of memory) before
# the next start refuses it, instead of being killed the same way on every restart.
EXTRACT_STARTS = 3
READY_MARKER = ".trainbox-ready.json"
GB = 1e9
# The guide's sizing rule: data + checkpoints + about 30 %.
DISK_MARGIN = 1.3
# Unpacked size per packed byte, before extraction tells: images barely compress.
_UNPACKED_PER_BYTE = {"tar": 1.0, "gz": 1.5}
# One checkpoint (model, EMA, optimizer) by model size letter, in MB; measured: YOLO9-t 35, YOLO9-s 119.
_CHECKPOINT_MB = {"n": 35, "t": 35, "s": 120, "m": 330, "c": 450, "l": 450, "x": 950, "e": 950}
_UNKNOWN_CHECKPOINT_MB = 450
_DEFAULT_MODEL = "yolox-s"  # libreyolo train's default
_DEFAULT_EPOCHS, _DEFAULT_SAVE_PERIOD = 300, 10


@dataclass(frozen=True)
class PreparedDataset:
    data_yaml: Path  # the data.yaml libreyolo gets: its `path` points at the dataset root
    root: Path
    description: str
    revision: str | None = None  # the resolved commit sha of a Hub dataset
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds by step, when work was done


def data_dir(settings: Settings) -> Path:
    return settings.workdir / "data"


def prepare(settings: Settings) -> PreparedDataset:
    try:
        return _prepare(settings)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskSpaceError(
            f"the disk of WORKDIR filled up while preparing the dataset: {error.strerror}",
            f"free space in {settings.workdir}, or rent a bigger disk",
        ) from None


def _prepare(settings: Settings) -> PreparedDataset:
    if settings.dataset_kind is DatasetKind.DEMO:
        data_yaml = demo.write_demo_dataset(data_dir(settings) / "demo")
        logger.info(
            "dataset: the bundled demo (%d images, classes %s)",
            demo.TRAIN_IMAGES + demo.VAL_IMAGES,
            ", ".join(demo.CLASSES),
        )
        return PreparedDataset(data_yaml=data_yaml, root=data_yaml.parent, description="bundled demo")
    if settings.dataset_kind is DatasetKind.LOCAL_DIR:
        assert settings.dataset_repo is not None
        root = Path(settings.dataset_repo)
        if not root.is_dir():
            raise DatasetNotFoundError(f"dataset folder {root} does not exist", "fix DATASET_REPO")
        source_yaml = locate_data_yaml(root, settings.data_yaml)
        resolved = write_resolved_yaml(source_yaml, data_dir(settings) / "local" / _path_key(root) / "data.yaml")
        doctor(resolved, imgsz=_imgsz(settings), fingerprint=_folder_fingerprint(root, source_yaml))
        return PreparedDataset(data_yaml=resolved, root=root, description=str(root))
    if settings.dataset_kind is DatasetKind.LOCAL_TAR:
        return _prepare_local_tar(settings)
    from . import hub as dataset_hub

    return dataset_hub.prepare(settings)


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


def write_resolved_yaml(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose ``path`` is absolute, so libreyolo finds the data wherever it runs."""
    try:
        config = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise DatasetInvalidError(f"{source.name} is not valid YAML: {error}".splitlines()[0], "fix the file") from None
    if not isinstance(config, dict):
        raise DatasetInvalidError(f"{source.name} is not a YAML mapping", "see libreyolo's dataset format")
    root = source.parent
    given = config.get("path")
    if isinstance(given, str) and given:
        given_path = Path(given)
        # An absolute path from the machine the dataset was made on is meaningless here.
        if not given_path.is_absolute() and (root / given_path).is_dir():
            root = (root / given_path).resolve()
    config["path"] = str(root.resolve())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def doctor(data_yaml: Path, *, imgsz: int, fingerprint: str) -> dict[str, Any]:
    """Run ``libreyolo doctor``; stop on its errors. Skipped when this exact data already passed."""
    marker = data_yaml.parent / _DOCTOR_MARKER
    fingerprint = f"{fingerprint}:imgsz={imgsz}"  # the check depends on the image size too
    try:
        cached = json.loads(marker.read_text())
        if cached.get("fingerprint") == fingerprint:
            logger.info("dataset check: passed before, not repeated")
            return cached["report"]
    except (OSError, ValueError, KeyError):
        pass
    if _deferred is not None:  # prepare_checked_in_background(): started once the data is in place
        _deferred[fingerprint] = (data_yaml, imgsz)  # the last place wins: a staging folder is renamed
        return {}
    result = procs.run(_doctor_argv(data_yaml, imgsz), timeout=DOCTOR_TIMEOUT, cwd=data_yaml.parent)
    if result.timed_out or result.returncode is None:
        raise DatasetInvalidError(
            f"libreyolo doctor did not finish in {DOCTOR_TIMEOUT / 60:.0f} min",
            "check the data.yaml (libreyolo doctor)",
        )
    return _doctor_verdict(result.returncode, result.stdout, result.stderr, marker, fingerprint)


def _doctor_argv(data_yaml: Path, imgsz: int) -> list[str]:
    return [libreyolo_executable(), "doctor", str(data_yaml), "--imgsz", str(imgsz), "--json"]


def _doctor_verdict(returncode: int, stdout: str, stderr: str, marker: Path, fingerprint: str) -> dict[str, Any]:
    """Log doctor's warnings, raise on its errors; remember a pass in ``marker``."""
    try:
        report = json.loads(stdout)
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
        where = f" ({paths[0]})" if paths else ""
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise DatasetInvalidError(
            f"the dataset check found errors: {first.get('message')}{where}{more}",
            "fix the dataset; run `libreyolo doctor <data.yaml>` to see every finding",
        )
    summary = report.get("summary", {})
    logger.info("dataset check: %s errors, %s warnings", summary.get("errors", 0), summary.get("warnings", 0))
    write_json_atomic(marker, {"fingerprint": fingerprint, "report": report})
    return report


# -- the check beside the training's start ---------------------------------------------------------
# `libreyolo doctor` spends most of its ~5 s importing torch and libreyolo, as the training child does
# when it starts: run side by side, a cold start is not delayed by the check, and training is stopped
# at once if the check fails. Inside prepare_checked_in_background(), doctor() notes what to check here.
_deferred: dict[str, tuple[Path, int]] | None = None


def prepare_checked_in_background(settings: Settings) -> tuple[PreparedDataset, DatasetCheck | None]:
    """``prepare``, with the dataset check (if not cached) started once the data is in place, not waited for.

    The caller starts training, watches ``done()`` and stops training if ``result()`` raises. An
    archive is then marked ready before its check passed: a restart finds it extracted and checks it
    again (a pass is remembered only when it happens).
    """
    global _deferred
    _deferred = {}
    try:
        data = prepare(settings)
        wanted = dict(_deferred)
    finally:
        _deferred = None
    return data, DatasetCheck(wanted) if wanted else None


class DatasetCheck:
    """``libreyolo doctor`` running in the background on data in its final place."""

    def __init__(self, wanted: Mapping[str, tuple[Path, int]]) -> None:
        self._deadline = time.monotonic() + DOCTOR_TIMEOUT
        self._files = contextlib.ExitStack()  # the children's output, read once they exit
        self._runs: list[tuple[procs.Child, IO[bytes], IO[bytes], Path, str]] = []
        for fingerprint, (data_yaml, imgsz) in wanted.items():
            argv = _doctor_argv(data_yaml, imgsz)
            logger.info("+ %s (beside the start of training)", " ".join(argv))
            # files, not pipes: a long report must not block the child while nobody reads; closed by cancel()
            out = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
            err = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
            process = procs.Child(argv, cwd=data_yaml.parent, output=out, errors=err, echo=False)
            self._runs.append((process, out, err, data_yaml.parent / _DOCTOR_MARKER, fingerprint))

    def done(self) -> bool:
        return time.monotonic() > self._deadline or all(run[0].poll() is not None for run in self._runs)

    def result(self) -> None:
        """Wait for the verdict; raise what ``doctor`` raises."""
        try:
            for process, out, err, marker, fingerprint in self._runs:
                try:
                    code = process.wait(timeout=max(0.0, self._deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise DatasetInvalidError(
                        f"libreyolo doctor did not finish in {DOCTOR_TIMEOUT / 60:.0f} min", "check the dataset"
                    ) from None
                out.seek(0)
                err.seek(0)
                stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
                _doctor_verdict(code, stdout, stderr, marker, fingerprint)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop what still runs (the job ends early) and let go of the output files."""
        for process, *_ in self._runs:
            if process.poll() is None:
                process.stop(signal.SIGKILL, grace=0.0)  # bounded: a child stuck in the kernel is left behind
        self._files.close()


def _imgsz(settings: Settings) -> int:
    value = settings.run_args.get("imgsz") or "640"
    try:
        return max(int(part) for part in value.lower().replace("x", ",").split(",") if part.strip())
    except ValueError:
        return 640


def _path_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _folder_fingerprint(root: Path, data_yaml: Path) -> str:
    """Cheap identity of a local dataset: its data.yaml and the names, sizes and times of its files."""
    digest = hashlib.sha256(data_yaml.read_bytes())
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            stat = os.stat(os.path.join(folder, name))
            digest.update(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# -- disk ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DiskNeed:
    """What a dataset and its run need on WORKDIR's disk, in bytes, by the guide's sizing rule."""

    archive: int  # the tar still to be written (0 when it is already on disk)
    extracted: int  # estimate
    checkpoints: int  # estimate

    @property
    def required(self) -> int:
        return math.ceil((self.archive + self.extracted + self.checkpoints) * DISK_MARGIN)

    @property
    def recommended_gb(self) -> int:
        return max(1, math.ceil(self.required / GB))

    def breakdown(self) -> str:
        return (
            f"tar {self.archive / GB:.1f} GB + extracted ≈{self.extracted / GB:.1f} GB"
            f" + checkpoints ≈{self.checkpoints / GB:.1f} GB, +{DISK_MARGIN - 1:.0%}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive_bytes": self.archive,
            "extracted_bytes_estimate": self.extracted,
            "checkpoint_bytes_estimate": self.checkpoints,
            "margin": DISK_MARGIN,
            "required_bytes": self.required,
            "recommended_disk_gb": self.recommended_gb,
        }


def unpacked_estimate(archive_name: str, archive_bytes: int) -> int:
    kind = "gz" if archive_name.endswith((".gz", ".tgz")) else "tar"
    return math.ceil(archive_bytes * _UNPACKED_PER_BYTE[kind])


def checkpoint_estimate(args: RunArgs) -> int:
    """Bytes of the checkpoints a run keeps: last.pt, best.pt, one epoch_N.pt per save_period, upload copies."""
    model = args.get("model") or _DEFAULT_MODEL
    stem = Path(model).name.lower().removesuffix(".pt").removesuffix(".yaml")
    letter = stem[-1:] if "yolo" in stem or "detr" in stem else ""
    each = _CHECKPOINT_MB.get(letter, _UNKNOWN_CHECKPOINT_MB) * 1e6
    epochs = _int_arg(args, "epochs", _DEFAULT_EPOCHS)
    period = _int_arg(args, "save_period", _DEFAULT_SAVE_PERIOD)
    kept = 2 + (epochs // period if period > 0 else 0) + 3  # + copies staged for upload
    return math.ceil(each * kept)


def _int_arg(args: RunArgs, key: str, default: int) -> int:
    try:
        return int(args.get(key) or default)
    except ValueError:
        return default


def free_bytes(path: Path) -> int:
    """Free space for us on the filesystem holding ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(workdir: Path, need: DiskNeed) -> int:
    """Stop before downloading when WORKDIR's disk is too small; return its free bytes."""
    free = free_bytes(workdir)
    if free < need.required:
        raise DiskSpaceError(
            f"WORKDIR has {free / GB:.1f} GB free, this dataset and run need {need.required / GB:.1f} GB"
            f" ({need.breakdown()})",
            f"rent a disk of at least {need.recommended_gb} GB, or free space in {workdir}",
        )
    return free


# -- extracted archives, cached on the volume ---------------------------------------------------
Fill = Callable[[Path], extract.ExtractReport]


def read_ready_marker(entry: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The marker of a complete entry for exactly this archive, or None."""
    try:
        marker = json.loads((entry / READY_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("identity") != identity or not (entry / "tree").is_dir():
        return None
    return marker


def install_archive(
    settings: Settings, entry: Path, identity: dict[str, Any], fill: Fill, description: str
) -> tuple[PreparedDataset, dict[str, Any]]:
    """Extract an archive into ``entry/tree`` through a staging folder; check it; mark it ready.

    ``fill(folder)`` extracts into ``folder`` (which must not exist yet). Nothing is left behind
    on failure; ``entry`` appears only once the data passed the check.
    """
    staging = entry.with_name(f".{entry.name}.staging")
    starts = _count_extraction(entry, identity)
    shutil.rmtree(staging, ignore_errors=True)  # an earlier attempt that was cut short
    shutil.rmtree(entry, ignore_errors=True)  # present without its marker: incomplete
    staging.mkdir(parents=True)
    try:
        started = time.monotonic()
        report = fill(staging / "tree")
        timings = {"transfer": round(time.monotonic() - started, 3)}
        logger.info(
            "dataset: %d files, %.2f GB extracted in %.1f s", report.files, report.bytes / GB, timings["transfer"]
        )
        started = time.monotonic()
        _checked_yaml(settings, staging, report.data_yamls, identity)
        timings["check"] = round(time.monotonic() - started, 3)
        os.rename(staging, entry)
    except BaseException as error:
        if not isinstance(error, extract.STOP_REQUESTS):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:  # any end the agent lived to see, success or error, is not a kill
        starts.unlink(missing_ok=True)
    prepared = _checked_yaml(settings, entry, report.data_yamls, identity, description)
    marker = {
        "identity": identity,
        "files": report.files,
        "bytes": report.bytes,
        "data_yamls": report.data_yamls,
        "created_at": now_iso(),
    }
    write_json_atomic(entry / READY_MARKER, marker)
    return replace(prepared, timings=timings), marker


def _count_extraction(entry: Path, identity: dict[str, Any]) -> Path:
    """Count this start of the extraction on the volume; refuse after ``EXTRACT_STARTS`` that ended in a kill.

    The crash-loop breaker judges attempts that ended with an exit code; an agent killed by the
    kernel (out of memory) leaves none, so only this count on the volume stops the loop."""
    path = entry.with_name(f".{entry.name}.starts.json")
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    count = int(record.get("starts", 0)) if record.get("identity") == identity else 0
    if count >= EXTRACT_STARTS:
        raise CrashLoopError(
            f"the last {count} extractions of this dataset archive were cut short without an error"
            " (the agent was killed: out of memory?); not trying again",
            f"check the archive, or use a machine with more memory and delete {path}",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"identity": identity, "starts": count + 1, "at": now_iso()})
    return path


def use_ready_archive(settings: Settings, entry: Path, marker: dict[str, Any], description: str) -> PreparedDataset:
    return _checked_yaml(settings, entry, marker.get("data_yamls"), marker["identity"], description)


def _checked_yaml(
    settings: Settings,
    entry: Path,
    data_yamls: Sequence[str] | None,
    identity: dict[str, Any],
    description: str = "",
) -> PreparedDataset:
    root = entry / "tree"
    source = locate_data_yaml(root, settings.data_yaml, data_yamls)
    resolved = write_resolved_yaml(source, entry / "data.yaml")
    chosen = source.relative_to(root).as_posix()
    fingerprint = hashlib.sha256(json.dumps([identity, chosen], sort_keys=True).encode()).hexdigest()
    doctor(resolved, imgsz=_imgsz(settings), fingerprint=fingerprint)
    return PreparedDataset(data_yaml=resolved, root=root, description=description)


def _prepare_local_tar(settings: Settings) -> PreparedDataset:
    assert settings.dataset_repo is not None
    tar = Path(settings.dataset_repo)
    try:
        info = tar.stat()
    except OSError:
        raise DatasetNotFoundError(f"dataset tar {tar} does not exist", "fix DATASET_REPO") from None
    identity = {"source": "local_tar", "path": str(tar), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    entry = data_dir(settings) / "local" / f"{_path_key(tar)}-{_safe_name(tar.name)}"
    marker = read_ready_marker(entry, identity)
    if marker is not None:
        logger.info("dataset: %s already extracted (%d files), not repeated", tar.name, marker.get("files", 0))
        return use_ready_archive(settings, entry, marker, str(tar))
    need = DiskNeed(0, unpacked_estimate(tar.name, info.st_size), checkpoint_estimate(settings.run_args))
    free = check_disk(settings.workdir, need)
    logger.info("dataset: extracting %s (%.2f GB)", tar, info.st_size / GB)

    def fill(folder: Path) -> extract.ExtractReport:
        return extract.extract(extract.read_file(tar), folder, max_bytes=free - need.checkpoints)

    prepared, _ = install_archive(settings, entry, identity, fill, str(tar))
    return prepared


def _safe_name(name: str) -> str:
    """A file-system-friendly form of a name from elsewhere (repo ids, file names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:80] or "x"


# -- `trainbox plan`: the disk to rent ---------------------------------------------------------------
def disk_report(settings: Settings) -> tuple[dict[str, Any], list[str]]:
    """The disk WORKDIR needs for this job (JSON fields, text lines): from the tar's size, on the Hub
    without downloading it, and the checkpoints the chosen model and RUN_ARGS keep."""
    checkpoints = checkpoint_estimate(settings.run_args)
    kind = settings.dataset_kind
    if kind is DatasetKind.HUB:
        from . import hub as dataset_hub

        remote = dataset_hub.remote_archive(settings)
        size = remote.size or 0
        need = DiskNeed(size, unpacked_estimate(remote.path, size), checkpoints)
        source = f"{settings.dataset_repo}:{remote.path} at {remote.revision[:12]}"
    elif kind is DatasetKind.LOCAL_TAR:
        assert settings.dataset_repo is not None
        size = Path(settings.dataset_repo).stat().st_size
        need = DiskNeed(0, unpacked_estimate(settings.dataset_repo, size), checkpoints)
        source = settings.dataset_repo
    else:  # a local folder is already in place; the demo is a few MB
        need = DiskNeed(0, 0, checkpoints)
        source = settings.dataset_repo or "the bundled demo"
    args = settings.run_args
    model = args.get("model") or _DEFAULT_MODEL
    epochs, period = _int_arg(args, "epochs", _DEFAULT_EPOCHS), _int_arg(args, "save_period", _DEFAULT_SAVE_PERIOD)
    fields = {"dataset": source, "model": model, "epochs": epochs, "save_period": period, **need.as_dict()}
    lines = [
        f"disk: {need.breakdown()} = {need.required / GB:.1f} GB",
        f"  dataset {source}; checkpoints of {model}, {epochs} epochs, one kept every {period}",
        f"  rent at least {need.recommended_gb} GB for WORKDIR (a disk cannot shrink later, and bills while stopped)",
    ]
    return fields, lines
