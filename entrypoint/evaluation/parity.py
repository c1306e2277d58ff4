"""Does an export compute what ``best.pt`` computes? Their raw outputs (before NMS) on the same preprocessed images,
compared elementwise: ``|export − best.pt| ≤ atol + rtol·|best.pt|`` everywhere (numpy's ``allclose`` rule).

The metric on the scored split says what the user gets; it cannot see a broken export of a barely trained model
(both score 0). The raw outputs can: a YOLO head's raw output is every anchor's box (pixels of the input canvas) and
class scores (0-1), each of which a sound export reproduces to its precision's rounding.

``compare`` runs in the check's child (evaluation/rawcheck.py, numpy imported there); the tolerance, the words and
the judgement (evaluation/record.py) are the agent's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IMAGES = 8  # the first images of the scored split, in its order (evaluation/split.py)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# FP32 runtimes (ONNX Runtime, OpenVINO, TorchScript) run the same graph as PyTorch with other kernels: sums in
# another order move a value by a few float32 ulps per layer. On a 2-epoch YOLOv9-t at 64 px the ONNX file differs
# by 6e-5 at most, on boxes up to 288 px (2e-7 relative); a thousandth, absolute on the scores and relative on the
# pixels, leaves that margin tenfold for deeper models and larger canvases, and refuses a wrong graph or weights.
FP32 = Tolerance(atol=1e-3, rtol=1e-3)
# A TensorRT engine is built FP16 (--half): a half float carries 11 significant bits (a relative step of 1e-3), and
# every layer rounds again; through ~100 layers an activation drifts by about a percent, a score (sigmoid, slope at
# most 1/4) by about a hundredth. 5 % catches a wrong graph, layout or preprocessing; the finer judgement of an
# FP16 engine is its mAP50-95 on the split (1 point, evaluation/record.py).
FP16 = Tolerance(atol=5e-2, rtol=5e-2)
_BY_FORMAT = {"tensorrt": FP16}


def tolerance(fmt: str) -> Tolerance:
    return _BY_FORMAT.get(fmt, FP32)


def compare(pairs: Sequence[tuple[Sequence[Any], Sequence[Any]]], allowed: Tolerance) -> dict[str, Any]:
    """``pairs``: per image, best.pt's output tensors and the export's (array-likes, in the graph's order). The
    record eval.json keeps: ``{"images", "max_abs_diff", "atol", "rtol", "within"}``. Outputs of another number or
    shape are a ``ValueError``: no tolerance makes them the same model."""
    import numpy as np

    largest, within, broken = 0.0, True, 0
    for index, (reference, candidate) in enumerate(pairs):
        if len(reference) != len(candidate):
            raise ValueError(f"image {index}: best.pt gives {len(reference)} outputs, the export {len(candidate)}")
        for ours, theirs in zip(reference, candidate, strict=True):
            a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
            if a.shape != b.shape:
                raise ValueError(f"image {index}: best.pt's output is {a.shape}, the export's {b.shape}")
            difference = np.abs(b - a)
            finite = np.isfinite(difference)
            broken += int(difference.size - np.count_nonzero(finite))  # a NaN or an inf: never within
            if finite.any():
                largest = max(largest, float(difference[finite].max()))
            within = within and bool(np.all(difference <= allowed.atol + allowed.rtol * np.abs(a)))
    found: dict[str, Any] = {
        "images": len(pairs),
        "max_abs_diff": float(f"{largest:.3g}"),
        "atol": allowed.atol,
        "rtol": allowed.rtol,
        "within": within and broken == 0,
    }
    return found | ({"not_finite": broken} if broken else {})


def valid(raw: Any) -> bool:
    return (
        isinstance(raw, dict)
        and isinstance(raw.get("within"), bool)
        and isinstance(raw.get("max_abs_diff"), int | float)
        and isinstance(raw.get("images"), int)
    )


def words(raw: dict[str, Any]) -> str:
    """``raw outputs: max Δ 6.1e-05 on 8 image(s) (atol 0.001, rtol 0.001)``: no ``|``, it sits in the card's tables."""
    broken = f", {raw['not_finite']} not finite" if raw.get("not_finite") else ""
    return (
        f"raw outputs: max Δ {raw['max_abs_diff']:.2g}{broken} on {raw['images']} image(s)"
        f" (atol {raw['atol']:g}, rtol {raw['rtol']:g})"
    )
