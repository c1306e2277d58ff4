"""Values that cannot train are refused when settings are read (so by `--dry-run`, and before the GPU check):
exit 10, one line naming the fix. The tables of what libreyolo knows are checked against its installed source."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import libreyolo, parsing
from entrypoint.errors import ConfigError
from entrypoint.settings import from_env

SLACK = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"


def make(tmp_path: Path, **env: str):
    return from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none"} | env)


@pytest.mark.parametrize(
    ("run_args", "said", "fix"),
    [
        ("epochs=0", "epochs=0 trains nothing", "epochs to 1 or more"),
        ("epochs=-1", "epochs=-1 trains nothing", "epochs to 1 or more"),
        ("batch=0", "batch=0 is not a batch size", "batch=-1 to size it"),
        ("batch=-2", "batch=-2 is not a batch size", "batch=-1 to size it"),
        ("imgsz=0", "imgsz=0 is not an image size", "imgsz=640"),
        ("imgsz=-640", "imgsz=-640 is not an image size", "imgsz=640"),
        ("imgsz=big", "imgsz='big' is not an image size", "imgsz=640"),
        ("model=LibreYOLO9s.pt imgsz=100", "not a multiple of LibreYOLO9s.pt's stride 32", "use imgsz=96 (128 is what"),
        ("model=yolo9-t imgsz=630", "yolo9-t's stride 32", "use imgsz=640"),
        ("model=LibreYOLO9E2Es.pt imgsz=20x700", "stride 32", "use imgsz=32x704"),
        ("model=yolov8n.pt", "yolov8n.pt is an Ultralytics model", "model=LibreYOLO9s.pt"),
        ("model=yolo11s.pt", "yolo11s.pt is an Ultralytics model", "LibreYOLOX"),
        ("model=YOLOv5s", "YOLOv5s is an Ultralytics model", "LibreYOLO"),
        ("model=yolo9", "is not a model LibreYOLO knows", "LibreYOLO9{t,s,m,c}.pt"),
        ("model=resnet", "is not a model LibreYOLO knows", "hf://org/name"),
    ],
)
def test_a_value_that_cannot_train_is_refused_naming_the_fix(
    tmp_path: Path, run_args: str, said: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        make(tmp_path, DATASET_REPO="acme/cones", RUN_ARGS=run_args)
    assert refused.value.exit_code == 10
    assert said in refused.value.message and fix in str(refused.value.hint), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "run_args",
    [
        "epochs=1 batch=-1",
        "batch=1 imgsz=640",
        "model=LibreYOLO9t.pt imgsz=480x640",
        "model=LibreYOLOXs.pt imgsz=100",  # YOLOX has no stride rule in libreyolo: any size trains
        "model=yolox-s imgsz=100",
        "model=hf://acme/detector imgsz=100",
        "model=/models/best.pt",
        "model=runs/exp/weights/last.pt",
        "model=best.pt",
        "model=LibreRTDETRv2s.pt",
        "",  # libreyolo's own default, yolox-s
    ],
)
def test_values_that_train_pass(tmp_path: Path, run_args: str) -> None:
    make(tmp_path, DATASET_REPO="acme/cones", RUN_ARGS=run_args)


def test_the_dry_run_refuses_in_one_line_with_exit_10(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "RUN_ARGS": "epochs=0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint", "run", "--dry-run"],
        env=env | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 10, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"trainbox \S+ ERROR: RUN_ARGS epochs=0 trains nothing — .+", lines[0])


# -- GPUS -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "count", "said"),
    [
        ("1", 1, "GPUS=1 names GPU index 1, and this machine has 1 GPU (index 0-0)"),
        ("0,2", 2, "GPUS=0,2 names GPU index 2, and this machine has 2 GPUs (indexes 0-1)"),
        ("4,5", 4, "names GPU index 4,5"),
    ],
)
def test_gpus_naming_a_device_this_machine_lacks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: str, count: int, said: str
) -> None:
    monkeypatch.setattr(parsing, "visible_gpus", lambda: count)
    with pytest.raises(ConfigError) as refused:
        make(tmp_path, GPUS=gpus)
    assert said in refused.value.message
    assert "GPUS=all trains on every GPU, GPUS=0 on the first" in str(refused.value.hint)


def test_gpus_within_the_count_or_without_a_driver_to_ask_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsing, "visible_gpus", lambda: 2)
    assert make(tmp_path, GPUS="0,1").gpus.indices == (0, 1)
    assert make(tmp_path, GPUS="all").gpus.all
    monkeypatch.setattr(parsing, "visible_gpus", lambda: None)  # no driver: the GPU check says what is missing
    assert make(tmp_path, GPUS="3").gpus.indices == (3,)


def test_gpus_are_counted_from_nvidia_smi_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\n[ "$1" = -L ] || exit 9\n'
        "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert parsing.visible_gpus() == 2
    with pytest.raises(ConfigError, match="this machine has 2 GPUs"):
        make(tmp_path, GPUS="2")


# -- NOTIFY -----------------------------------------------------------------------------------------
def test_notify_keeps_commas_inside_urls(tmp_path: Path) -> None:
    mail = "mailto://user:pass@example.com?to=a@example.com,b@example.com"
    channels = f"{SLACK}/#alerts,#builds"
    settings = make(tmp_path, NOTIFY=f"{mail}, {channels},ntfy://my-topic")
    assert [url.reveal() for url in settings.notify] == [mail, channels, "ntfy://my-topic"]


def test_notify_with_a_scheme_apprise_does_not_know_is_refused_without_the_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        make(tmp_path, NOTIFY="ntfy://fine,slak://T1/B2/C3secretpart")
    assert "target 2 (slak://…) is not a service apprise knows" in refused.value.message
    assert "secretpart" not in str(refused.value)


# -- the tables, against the installed libreyolo ------------------------------------------------------
def _libreyolo_source() -> Path:
    spec = importlib.util.find_spec("libreyolo")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "models"


def test_the_families_are_libreyolos_own() -> None:
    found: dict[str, str] = {}
    strides: dict[str, int] = {}
    parents: dict[str, tuple[str, str]] = {}  # class -> (its first base, its family)
    for path in sorted(_libreyolo_source().rglob("*.py")):
        text = path.read_text()
        for match in re.finditer(r"^class (\w+)\(([^)]*)\):(.*?)(?=^class |\Z)", text, re.S | re.M):
            body = match.group(3)
            prefix = re.search(r'^\s+FILENAME_PREFIX(?::[^=]+)?\s*=\s*"([^"]+)"', body, re.M)
            family = re.search(r'^\s+FAMILY(?::[^=]+)?\s*=\s*"([^"]+)"', body, re.M)
            stride = re.search(r"^\s+IMGSZ_STRIDE(?::[^=]+)?\s*=\s*(\d+)", body, re.M)
            if prefix and family:
                found[prefix.group(1)] = family.group(1)
                parents[match.group(1)] = (match.group(2).split(",")[0].strip(), family.group(1))
            if stride and family:
                strides[family.group(1)] = int(stride.group(1))
    # a family inherits its base's stride (LibreYOLO9E2E(LibreYOLO9))
    by_class = {name: fam for name, (_, fam) in parents.items()}
    for base, fam in parents.values():
        if fam not in strides and by_class.get(base) in strides:
            strides[fam] = strides[by_class[base]]
    assert found == libreyolo.FAMILIES
    assert strides == libreyolo.IMGSZ_STRIDES
