"""The image's OpenCV is the headless build (no libGL, no GUI) standing in for `opencv-python`: pip is satisfied,
pip cannot swap the GUI build back in, and libreyolo still trains, validates and exports with it."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from tests.container.images import docker
from tests.support import make_dataset

pytestmark = [pytest.mark.container, pytest.mark.slow]


def run(image: str, *argv: str, volumes: dict[Path, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """``argv`` in a throwaway container with no network, as root's shell sees it."""
    mounts = [arg for host, inside in (volumes or {}).items() for arg in ("-v", f"{host}:{inside}")]
    result = docker(
        # One CPU granted, which libreyolo's train() reads (tests/container/test_compose.py says why).
        "run", "--rm", "--network", "none", "--cpus", "1", *mounts, "--entrypoint", "sh", image, "-c", " ".join(argv),
        timeout=timeout,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def gui_wheel(folder: Path, version: str) -> Path:
    """A wheel named like the GUI build of OpenCV, newer than anything installed: what an index could offer."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"opencv_python-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: opencv-python\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "cv2_gui_marker.py": b"",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"opencv_python-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_opencv_is_headless_and_pip_check_is_clean(trainbox_image: str) -> None:
    code, output = run(trainbox_image, "python3 -m pip check")
    assert code == 0, output

    code, output = run(trainbox_image, "python3 -m pip show opencv-python opencv-python-headless")
    assert code == 0, output
    assert "+headless" in output and "Requires: opencv-python-headless" in output

    # no GUI backend compiled in, and no libGL (Mesa) anywhere in the image
    code, output = run(
        trainbox_image,
        "python3 -c \"import cv2, re; print(re.search(r'GUI:\\s+(\\S+)', cv2.getBuildInformation()).group(1))\"",
    )
    assert code == 0, output
    assert output.strip() == "NONE"
    code, output = run(trainbox_image, "find / -xdev -name 'libGL.so*' -o -xdev -name 'libQt*' | head -n 5")
    assert code == 0 and output.strip() == "", output


def test_pip_cannot_bring_the_gui_build_back(trainbox_image: str, tmp_path: Path) -> None:
    gui_wheel(tmp_path / "index", "99.0.0")
    volumes = {tmp_path / "index": "/index"}
    offline = "python3 -m pip install --no-index --find-links /index"

    # libreyolo reinstalled with eager upgrades, the GUI build on offer: the stand-in stays
    code, output = run(
        trainbox_image, f"{offline} --upgrade --upgrade-strategy eager libreyolo opencv-python", volumes=volumes
    )
    assert code == 0, output
    code, output = run(trainbox_image, "python3 -m pip show opencv-python", volumes=volumes)
    assert "+headless" in output, output

    # asking for it by version is refused, naming the constraint
    code, output = run(trainbox_image, f"{offline} opencv-python==99.0.0", volumes=volumes)
    assert code != 0
    assert "(constraint)" in output or "ResolutionImpossible" in output, output


@pytest.mark.slow
def test_trains_validates_and_exports_with_the_headless_build(trainbox_image: str, tmp_path: Path) -> None:
    data_yaml = make_dataset(tmp_path / "data", train=8, val=4)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    script = " && ".join(
        [
            "cd /data",
            "libreyolo train data=/data/data.yaml model=LibreYOLO9t.pt pretrained=false imgsz=64 workers=0 "
            "eval_interval=1 epochs=1 device=cpu project=/out name=tiny exist_ok=true",  # trained and validated once
            "libreyolo val --model /out/tiny/weights/best.pt --data /data/data.yaml --imgsz 64 --device cpu",
            "cd /out",
            "libreyolo export --model /out/tiny/weights/best.pt --format torchscript --imgsz 64",
        ]
    )
    code, output = run(trainbox_image, script, volumes={data_yaml.parent: "/data", out: "/out"}, timeout=900)
    assert code == 0, output[-4000:]
    assert (out / "tiny" / "weights" / "best.pt").is_file()
    assert list(out.rglob("best.torchscript")), output[-2000:]
