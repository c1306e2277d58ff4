"""The stall guard against a silent child: real ``trainbox run`` processes and a stand-in ``libreyolo``.

libreyolo prints no progress bar without a terminal, so a long epoch is silent. A child that works
(CPU time in its tree) outlives STALL_TIMEOUT; one that does nothing at all is stopped as stalled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from entrypoint.state import Phase
from tests.support import run_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # `trainbox run` with a stand-in libreyolo that trains for seconds

SILENT_SECONDS = 6  # three times STALL_TIMEOUT, without a line of output
STANDIN = f"""\
import os, subprocess, sys, time
args = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
run_dir = os.path.join(args["project"], args["name"])
os.makedirs(run_dir, exist_ok=True)
if os.environ["FAKE_TRAIN_MODE"] == "busy":
    # The work happens in a child (like a DataLoader worker); this process only waits for it.
    burn = "import time\\nend = time.monotonic() + {SILENT_SECONDS}\\nwhile time.monotonic() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
else:
    time.sleep({SILENT_SECONDS})
print("epoch 1 done", flush=True)
"""


@pytest.mark.parametrize(("mode", "code", "phase"), [("busy", 0, Phase.DONE), ("idle", 81, Phase.STALLED)])
def test_a_silent_epoch_is_judged_by_its_work(tmp_path: Path, mode: str, code: int, phase: Phase) -> None:
    standin = tmp_path / "bin" / "libreyolo"
    standin.parent.mkdir()
    standin.write_text(f"#!{sys.executable}\n{STANDIN}")
    standin.chmod(0o755)
    env = trainbox_env(
        tmp_path / "work", GPUS="cpu", STALL_TIMEOUT="2s", TRAINBOX_LIBREYOLO=str(standin), FAKE_TRAIN_MODE=mode
    )
    result = run_trainbox("run", env=env, timeout=120)
    assert result.returncode == code, result.output
    (state_file,) = (tmp_path / "work" / "runs").glob("*/trainbox.json")
    assert json.loads(state_file.read_text())["phase"] == phase
    assert ("epoch 1 done" in result.output) is (mode == "busy")
