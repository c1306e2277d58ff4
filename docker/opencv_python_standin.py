"""Write and print a metadata-only ``opencv-python`` wheel that stands for the installed ``opencv-python-headless``.

libreyolo requires ``opencv-python``, whose wheels bundle Qt and video libraries and need the system's libGL
(Mesa, about 250 MB in the image). Training, validation and export only use OpenCV's headless API; the GUI calls
(``cv2.imshow`` in video predict's live window) are never reached. pip has no "replace this requirement" option,
so the image installs the headless build, then this stand-in: a distribution named ``opencv-python`` with no
files of its own, whose one requirement is the headless build of the same version. libreyolo's requirement is met
(``pip check`` is clean), and the version carries the local label ``+headless``, which no index publishes: pinned
as a pip constraint, no later ``pip install`` can bring the GUI build back.

Usage: ``python3 opencv_python_standin.py DEST_DIR`` prints the wheel's path, then the two constraint lines.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

LOCAL_LABEL = "headless"


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(dest: Path) -> tuple[Path, str, str]:
    headless = version("opencv-python-headless")
    standin = f"{headless}+{LOCAL_LABEL}"
    info = f"opencv_python-{standin}.dist-info"
    files = {
        f"{info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: opencv-python\n"
            f"Version: {standin}\n"
            "Summary: Stand-in for opencv-python: the headless build of the same version, without GUI libraries\n"
            f"Requires-Dist: opencv-python-headless=={headless}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: trainbox\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = dest / f"opencv_python-{standin}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel, f"opencv-python=={standin}", f"opencv-python-headless=={headless}"


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    print("\n".join(map(str, write_wheel(dest))))


if __name__ == "__main__":
    main()
