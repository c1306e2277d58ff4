"""On a real GPU machine with TensorRT installed (an image built with LIBREYOLO_EXTRAS=tensorrt): a short training
with EXPORT=onnx,tensorrt leaves an engine named for this GPU's architecture and TensorRT version, checked against
the .pt. Skipped, with the reason, without a GPU (tests/gpu/conftest.py) or without TensorRT."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.support import TINY_RUN_ARGS, make_dataset, run_trainbox, trainbox_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # trains a real model, builds a real engine


def test_a_tensorrt_engine_is_built_checked_and_named_for_this_gpu(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed here (pip install 'libreyolo[tensorrt]')")
    import tensorrt

    data_yaml = make_dataset(tmp_path / "data", train=8, val=4)
    workdir = tmp_path / "work"
    env = trainbox_env(
        workdir,
        DATASET_REPO=str(data_yaml.parent),
        GPUS="0",
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=4",
        EXPORT="onnx,tensorrt",
    )
    result = run_trainbox("run", env=env, timeout=1200)
    assert result.returncode == 0, result.output[-3000:]
    (run_dir,) = (workdir / "runs").iterdir()
    exports = json.loads((run_dir / "trainbox.json").read_text())["exports"]
    engine = exports["tensorrt"]
    assert engine["status"] == "published", engine
    sm = json.loads((run_dir / "trainbox.json").read_text())["gpus"]["gpus"][0]["sm"]  # sm_89
    assert engine["arch"] == sm.replace("_", "") and engine["tensorrt"] == tensorrt.__version__
    assert re.fullmatch(rf"weights/best\.{engine['arch']}\.trt[\d.]+\.engine", engine["file"]), engine["file"]
    assert (run_dir / engine["file"]).is_file()
    assert exports["onnx"]["status"] == "published"
