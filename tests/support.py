"""Helpers for tests that run the real agent: tiny datasets and a `trainbox` subprocess."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from entrypoint.dataset.demo import _image

# Fast, offline, from-scratch training settings for tests.
TINY_RUN_ARGS = "model=LibreYOLO9t.pt pretrained=false imgsz=64 workers=0 eval_interval=1"
# One torch thread per real training, as torchrun sets it for its workers: the contract lane's trainings run
# beside other tests (pytest-xdist), and torch's default threads spin-wait for cores other processes hold. Three
# 3-epoch test trainings at once on a 2-core machine: 27 s and 47 s of CPU, against 48 s and 92 s with the
# default threads. Set for every contract test (tests/conftest.py); a module fixture passes it itself.
ONE_TORCH_THREAD = {"OMP_NUM_THREADS": "1"}


def held_after(tmp_path: Path, epoch: int) -> dict[str, str]:
    """The stand-in trainer stops after ``epoch``, and after each later one, until ``open_gate`` opens that epoch
    (or a signal comes): a test's SIGTERM or look then always finds the run in training (timed epochs could let
    the whole run finish first on a loaded machine)."""
    gate = tmp_path / "gate"
    gate.mkdir(exist_ok=True)
    for opened in range(1, epoch):
        (gate / str(opened)).touch()
    return {"FAKE_EPOCH_GATE": str(gate)}


def open_gate(tmp_path: Path, *epochs: int) -> None:
    """Let a stand-in trainer held by ``held_after(tmp_path, ...)`` go on past each of ``epochs``."""
    for epoch in epochs:
        (tmp_path / "gate" / str(epoch)).touch()


def make_dataset(root: Path, *, train: int = 8, val: int = 4, seed: int = 7, relative_path: bool = True) -> Path:
    """A tiny YOLO dataset (coloured boxes) under ``root``; returns its data.yaml."""
    rng = random.Random(seed)
    for split, count in (("train", train), ("val", val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            png, labels = _image(rng)
            (root / "images" / split / f"{index:03d}.png").write_bytes(png)
            (root / "labels" / split / f"{index:03d}.txt").write_text("\n".join(labels) + "\n")
    data_yaml = root / "data.yaml"
    # A dataset made elsewhere carries a path from another machine, or a relative one.
    path_line = "path: ." if relative_path else "path: /nonexistent/where/it/was/made"
    data_yaml.write_text(
        f"{path_line}\ntrain: images/train\nval: images/val\nnames:\n  0: red\n  1: green\n  2: blue\n"
    )
    return data_yaml


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def trainbox_env(workdir: Path, **env: str) -> dict[str, str]:
    """The test process's environment (test Hub settings included) plus a workspace and ``env``."""
    kept = {"TRAINBOX_CACHE_DIR"}  # the session's answer from libreyolo (conftest): not asked again per agent
    base = {
        key: value
        for key, value in os.environ.items()
        if key in kept or not key.startswith(("TRAINBOX_", "RUN_", "DATASET_"))
    }
    for key in ("HF_TOKEN", "OUTPUT_REPO", "GPUS", "MAX_RUNTIME", "STALL_TIMEOUT", "ON_EXIT", "ON_FAILURE", "PROVIDER"):
        base.pop(key, None)
    return base | {"WORKDIR": str(workdir), "PROVIDER": "none"} | env


def run_trainbox(*args: str, env: dict[str, str], timeout: float = 600) -> Result:
    process = subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return Result(process.returncode, process.stdout, process.stderr)


def start_trainbox(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_standin_agent(
    tmp_path: Path, env: dict[str, str], workdir: Path, timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    """``trainbox run`` on the CPU with the stand-in libreyolo (tests/fakes/libreyolo.py) installed in
    ``tmp_path/bin``: ``env`` (the test Hub's), a volume at ``workdir``, no provider, and ``extra``."""
    from tests.fakes import libreyolo as fake_libreyolo

    script = fake_libreyolo.install(tmp_path / "bin")
    full = env | {
        "WORKDIR": str(workdir),
        "GPUS": "cpu",
        "PROVIDER": "none",
        "TRAINBOX_LIBREYOLO": str(script),
        "FAKE_EPOCH_SECONDS": "0.1",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "run"], env=full, capture_output=True, text=True, timeout=timeout
    )


def process_alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a parent that no longer reaps."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] != "Z"


@cache
def code_digest() -> str:
    """The code a shared run is made by: the agent, the tests' helpers and fakes, the installed libreyolo."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    sources = [*(root / "entrypoint").rglob("*.py"), *(root / "tests" / "fakes").glob("*.py"), Path(__file__)]
    for path in sorted(sources):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    from importlib.metadata import version

    digest.update(version("libreyolo").encode())
    return digest.hexdigest()[:16]


def shared_run(name: str, inputs: object, make: Callable[[Path], dict]) -> tuple[Path, dict]:
    """``make(folder)`` once per test session, whichever pytest-xdist workers ask: a real training the tests only
    read (or copy) is trained once, not once per worker that runs one of them. The folder sits in the session's
    cache (tests/conftest.py: TRAINBOX_TEST_SESSION_CACHE), named by ``name`` and a hash of ``inputs`` and of the
    code that makes it; the first worker to ask makes it under a lock, the others wait and read it. Returns the
    folder and what ``make`` returned (JSON)."""
    key = hashlib.sha256(json.dumps([inputs, code_digest()], sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = Path(os.environ["TRAINBOX_TEST_SESSION_CACHE"]) / "runs" / f"{name}-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    record = folder / "made.json"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not record.is_file():
            if folder.exists():  # a make that did not finish (its worker timed out): made again
                import shutil

                shutil.rmtree(folder)
            folder.mkdir()
            record.write_text(json.dumps(make(folder)))
        return folder, json.loads(record.read_text())
