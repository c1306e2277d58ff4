"""The raw-output check's child: ``best.pt`` and an export run on the same preprocessed images (the export's own
preprocessing, at its canvas), their raw outputs before NMS compared elementwise (parity.py), the record printed as
one JSON line, ``RESULT`` first. Run by the agent as ``python -m entrypoint.evaluation.rawcheck``: torch, CUDA and
the format's runtime live in this child only.

best.pt's raw output is that of the very module libreyolo traces when it exports (its exporter's model context:
the head in export mode, the family's export wrapper), in FP32 with TF32 off, so it is the reference an FP32 export
must reproduce; the export's is what its libreyolo backend's runtime returns for the same input tensor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .parity import Tolerance, compare

RESULT = "TRAINBOX_RAW_OUTPUTS "


def raw_pairs(
    weights: Path, export: Path, images: list[Path], device: str, fmt: str
) -> list[tuple[list[Any], list[Any]]]:
    """Per image: best.pt's raw outputs and the export's, as numpy arrays."""
    import numpy as np
    import torch
    from libreyolo import LibreYOLO  # type: ignore[import-untyped]
    from libreyolo.export.exporter import BaseExporter  # type: ignore[import-untyped]

    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in true FP32 on a GPU too
    torch.backends.cudnn.allow_tf32 = False
    reference = LibreYOLO(str(weights), device=device)
    names = getattr(reference, "names", None)
    on_gpu = {"device": device} if fmt == "tensorrt" else {}  # the other runtimes pick their own
    exported = LibreYOLO(str(export), nb_classes=len(names) if names else None, **on_gpu)
    canvas = exported._resolve_predict_imgsz(None)
    where = next(reference.model.parameters()).device
    pairs: list[tuple[list[Any], list[Any]]] = []
    for image in images:
        tensor = exported._preprocess(str(image), canvas, "auto")[0]
        blob = np.ascontiguousarray(tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else tensor)
        theirs = [np.asarray(out) for out in exported._run_inference(blob)]
        shape = (int(blob.shape[-2]), int(blob.shape[-1]))
        context = BaseExporter.create("onnx", reference)._model_context(where, False, False, 1, shape)
        with context as (module, _), torch.no_grad():
            ours = _flat(module(torch.from_numpy(blob).to(where)))
        pairs.append(([out.detach().float().cpu().numpy() for out in ours], theirs))
    return pairs


def _flat(output: Any) -> list[Any]:
    """A module's output tensors in the order the exported graph lists them (a tensor, or tuples and lists)."""
    if isinstance(output, list | tuple):
        return [tensor for part in output for tensor in _flat(part)]
    if isinstance(output, dict):
        return [tensor for part in output.values() for tensor in _flat(part)]
    return [output]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m entrypoint.evaluation.rawcheck")
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--format", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--atol", type=float, required=True)
    parser.add_argument("--rtol", type=float, required=True)
    parser.add_argument("--images", type=Path, nargs="+", required=True)
    args = parser.parse_args(argv)
    pairs = raw_pairs(args.weights, args.export, args.images, args.device, args.format)
    print(RESULT + json.dumps(compare(pairs, Tolerance(args.atol, args.rtol))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
