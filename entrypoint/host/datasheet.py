"""What the cards people rent should do, from NVIDIA's own datasheets and architecture whitepapers.

All TFLOP/s are **dense** tensor-core figures (no 2:4 sparsity): datasheets print the sparse figure
first, twice the dense one, marked with an asterisk. For GeForce and RTX workstation cards the figure
is FP16/BF16 *with FP32 accumulate* (what torch's matmul uses); GeForce cards run FP16 accumulate at
twice that rate, which training does not use. Names are matched against what CUDA and nvidia-smi
report (``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 4090``), most specific first.
"""

from __future__ import annotations

from dataclasses import dataclass

_HOPPER = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100)"
_ADA_DC = "NVIDIA L40S / L4 datasheets (nvidia.com/en-us/data-center/l40s, /l4)"
_A10 = "NVIDIA A10 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/products/a10-gpu)"
_ADA = "NVIDIA Ada GPU Architecture whitepaper v2.01, appendix tables (FP16/BF16 with FP32 accumulate)"
_AMPERE = "NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix tables (FP16/BF16 with FP32 accumulate)"


@dataclass(frozen=True)
class Card:
    name: str
    match: tuple[str, ...]  # every word must appear in the reported name (case-insensitive)
    memory_gib: int
    bf16_tflops: float  # dense
    fp16_tflops: float  # dense
    pcie_gen: int
    pcie_width: int
    source: str


CARDS: tuple[Card, ...] = (
    Card("H200", ("h200",), 141, 989.4, 989.4, 5, 16, _H200 + ": 1,979 TFLOPS with sparsity"),
    Card("H100 NVL", ("h100", "nvl"), 94, 835.5, 835.5, 5, 16, _HOPPER + ": 1,671 TFLOPS with sparsity"),
    Card("H100 PCIe", ("h100", "pcie"), 80, 756.5, 756.5, 5, 16, _HOPPER + ": 1,513 TFLOPS with sparsity"),
    Card("H100 SXM", ("h100",), 80, 989.4, 989.4, 5, 16, _HOPPER + ": 1,979 TFLOPS with sparsity"),
    Card("A100 80GB", ("a100", "80gb"), 80, 312.0, 312.0, 4, 16, _A100 + ": 624 TFLOPS with sparsity"),
    Card("A100 40GB", ("a100",), 40, 312.0, 312.0, 4, 16, _A100 + ": 624 TFLOPS with sparsity"),
    Card("L40S", ("l40s",), 48, 362.05, 362.05, 4, 16, _ADA_DC + ": 733 TFLOPS with sparsity"),
    Card("L4", ("l4",), 24, 121.0, 121.0, 4, 16, _ADA_DC + ": 242 TFLOPS with sparsity"),
    Card("A10", ("a10",), 24, 125.0, 125.0, 4, 16, _A10 + ": 250 TFLOPS with sparsity"),
    Card("RTX 6000 Ada", ("rtx", "6000", "ada"), 48, 364.2, 364.2, 4, 16, _ADA + ": 728.5 with sparsity"),
    Card("RTX A6000", ("a6000",), 48, 154.8, 154.8, 4, 16, _AMPERE + ": 309.7 with sparsity"),
    Card("RTX 4090", ("4090",), 24, 165.2, 165.2, 4, 16, _ADA + ": 330.3 with sparsity"),
    Card("RTX 3090", ("3090",), 24, 71.0, 71.0, 4, 16, _AMPERE + ": 142 with sparsity"),
)


def lookup(name: str | None) -> Card | None:
    """The datasheet entry for a card as CUDA or nvidia-smi names it; None for a card not in the table."""
    words = (name or "").lower().replace("-", " ")
    tokens = set(words.split())
    for card in CARDS:
        if all(part in tokens or (len(part) > 3 and part in words) for part in card.match):
            return card
    return None
