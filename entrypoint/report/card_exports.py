"""The card's "Exported models" section: each EXPORT format, published or why not, and how to load each file."""

from __future__ import annotations

from typing import Any


def section(exports: dict[str, Any], repo_id: str | None, run_name: str) -> list[str]:
    """Markdown lines; none when the run exported nothing (EXPORT=off, or not finished yet)."""
    records = {name: record for name, record in exports.items() if isinstance(record, dict)}
    if not records:
        return []
    lines = ["### Exported models", "", "| format | file | checked |", "|---|---|---|"]
    for name, record in records.items():
        if record.get("status") == "published":
            lines.append(f"| {name} | `{record.get('file')}` | {record.get('check', '')} |")
        else:
            lines.append(f"| {name} | not published: {record.get('why', record.get('status'))} | |")
    lines.append("")
    for name, record in records.items():
        if record.get("status") == "published" and isinstance(record.get("file"), str):
            lines += _snippet(name, record, repo_id, run_name)
    return lines


def _snippet(name: str, record: dict[str, Any], repo_id: str | None, run_name: str) -> list[str]:
    file = str(record["file"])
    if repo_id is None:
        fetch = [f'path = "runs/{run_name}/{file}"']
    elif name == "openvino":  # a folder of files
        fetch = [
            "from huggingface_hub import snapshot_download",
            f'path = snapshot_download("{repo_id}", allow_patterns="{file}/*") + "/{file}"',
        ]
    else:
        fetch = ["from huggingface_hub import hf_hub_download", f'path = hf_hub_download("{repo_id}", "{file}")']
    lines = [f"{record.get('runtime', name)}:", "", "```python", *fetch]
    if name == "onnx":
        lines += [
            "import onnxruntime as ort  # pip install onnxruntime",
            "session = ort.InferenceSession(path)",
            "print(session.get_inputs()[0].shape)  # RGB in 0..1, letterboxed; or, with the pre- and post-processing:",
        ]
    lines += [
        "from libreyolo import LibreYOLO",
        "model = LibreYOLO(path)",
        'results = model.predict("image.jpg")',
        "```",
        "",
    ]
    if name == "tensorrt":
        lines += [
            f"The engine runs on GPUs of architecture {record.get('arch')} with TensorRT {record.get('tensorrt')}"
            " only; on another, export it there from `weights/best.pt`.",
            "",
        ]
    return lines
