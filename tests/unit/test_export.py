"""EXPORT's pieces without a training: the formats it takes, the up-front refusals, the export check's rule,
config.json and the card's section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint import libreyolo
from entrypoint.errors import ConfigError
from entrypoint.export import hubconfig
from entrypoint.export.run import _forget_earlier, _published_name
from entrypoint.export.verify import validation_images
from entrypoint.report import card_exports
from entrypoint.run_args import parse as parse_args


def test_formats_are_read_in_order_once_with_libreyolos_aliases() -> None:
    assert libreyolo.parse_export("EXPORT", "onnx, engine,ONNX", None) == ("onnx", "tensorrt")
    assert libreyolo.parse_export("EXPORT", "off", None) == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [("foo", "'foo': unknown"), ("ncnn", "'ncnn': libreyolo exports it, but Trainbox cannot check it"), (",", "")],
)
def test_a_format_the_agent_cannot_make_and_check_is_refused(value: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        libreyolo.parse_export("EXPORT", value, None)
    assert words in str(caught.value) and caught.value.exit_code == 10
    assert "EXPORT=" in (caught.value.hint or "")


def test_a_format_whose_packages_are_missing_names_the_image_that_has_them() -> None:
    present = {"onnx", "onnxruntime"}

    def find(module: str) -> str | None:
        return module if module in present else None

    libreyolo.check_export_installed(("onnx", "torchscript"), find=find)
    with pytest.raises(ConfigError) as caught:
        libreyolo.check_export_installed(("onnx", "openvino"), find=find)
    assert "EXPORT=openvino needs openvino" in str(caught.value)
    assert "LIBREYOLO_EXTRAS=openvino" in (caught.value.hint or "")


def test_tensorrt_needs_a_gpu() -> None:
    libreyolo.check_export_gpu(("onnx", "tensorrt"), has_gpu=True)
    libreyolo.check_export_gpu(("onnx",), has_gpu=False)
    with pytest.raises(ConfigError, match="EXPORT=tensorrt needs a GPU"):
        libreyolo.check_export_gpu(("onnx", "tensorrt"), has_gpu=False)


def test_validation_images_are_read_through_data_yaml(tmp_path: Path) -> None:
    (tmp_path / "images" / "val").mkdir(parents=True)
    for name in ("b.png", "a.jpg", "c.txt", "d.png", "e.png"):
        (tmp_path / "images" / "val" / name).write_bytes(b"")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [x]\n")
    assert [p.name for p in validation_images(tmp_path / "data.yaml")] == ["a.jpg", "b.png", "d.png"]


def test_a_tensorrt_engine_is_named_for_the_gpu_and_tensorrt_that_built_it() -> None:
    best = Path("run/weights/best.pt")
    assert _published_name(libreyolo.EXPORT_FORMATS["tensorrt"], best, {"arch": "sm89", "tensorrt": "10.13"}) == (
        "best.sm89.trt10.13.engine"
    )
    assert _published_name(libreyolo.EXPORT_FORMATS["onnx"], best, {}) == "best.onnx"
    assert _published_name(libreyolo.EXPORT_FORMATS["openvino"], best, {}) == "best_openvino"


def test_config_json_says_which_model_size_and_classes(tmp_path: Path) -> None:
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text("names:\n  1: green\n  0: red\n  10: blue\n")
    exports = {"onnx": {"status": "published", "file": "weights/best.onnx"}, "openvino": {"status": "failed"}}
    path = hubconfig.write(tmp_path, parse_args("model=LibreYOLO9s.pt imgsz=640"), data_yaml, exports)
    assert path.name == "config.json"
    assert json.loads(path.read_text()) == {
        "library_name": "libreyolo",
        "model": "LibreYOLO9s.pt",
        "imgsz": 640,
        "num_classes": 3,
        "names": ["red", "green", "blue"],
        "weights": "weights/best.pt",
        "exports": {"onnx": "weights/best.onnx"},
    }


def test_the_card_lists_each_export_with_a_snippet_or_why_not() -> None:
    exports = {
        "onnx": {"status": "published", "file": "weights/best.onnx", "runtime": "ONNX Runtime", "check": "60/60"},
        "tensorrt": {"status": "published", "file": "weights/best.sm89.trt10.13.engine", "arch": "sm89",
                     "tensorrt": "10.13", "runtime": "TensorRT"},
        "openvino": {"status": "failed", "why": "libreyolo export openvino did not finish within 900 s"},
    }  # fmt: skip
    text = "\n".join(card_exports.section(exports, "org/cones", "run"))
    assert "| onnx | `weights/best.onnx` | 60/60 |" in text
    assert "| openvino | not published: libreyolo export openvino did not finish within 900 s | |" in text
    assert 'hf_hub_download("org/cones", "weights/best.onnx")' in text
    assert "ort.InferenceSession(path)" in text
    assert "architecture sm89 with TensorRT 10.13" in text
    assert card_exports.section({}, "org/cones", "run") == []


def test_an_earlier_attempts_export_is_removed_before_a_new_one(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    (weights / "best_openvino").mkdir(parents=True)
    for name in ("best.pt", "best.onnx", "best.sm80.trt10.1.engine", "best.sm89.trt10.13.engine", "last.pt"):
        (weights / name).write_bytes(b"x")
    best = weights / "best.pt"
    for name in ("onnx", "tensorrt", "openvino"):
        _forget_earlier(libreyolo.EXPORT_FORMATS[name], best)
    assert sorted(path.name for path in weights.iterdir()) == ["best.pt", "last.pt"]
