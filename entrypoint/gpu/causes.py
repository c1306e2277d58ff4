"""What a failed GPU check means, and what to do about it.

The GPU check (``gpu.probe``, run in a child) reports raw error texts from torch, the CUDA
runtime and NCCL. ``classify`` turns such a text into one of the typed ``GpuError``s with a
one-line cause and the fix. Each known text below names where it comes from, so a change in a
future torch or NCCL release can be checked against its source.

Pure functions only: no torch import, so the agent (which never creates a CUDA context) and the
unit tests can use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from ..errors import GpuArchitectureError, GpuDriverError, GpuError, NcclError, NoGpuError

P2P_ADVICE = "set NCCL_P2P_DISABLE=1 (GPU-to-GPU copies then go through host memory, slower but working)"


class Kind(StrEnum):
    NO_GPU = "no_gpu"
    DRIVER = "driver"
    ARCH = "arch"
    CPU_BUILD = "cpu_build"
    NOT_READY = "not_ready"
    BUSY = "busy"
    OUT_OF_MEMORY = "out_of_memory"
    FAULTY = "faulty"
    PEER_ACCESS = "peer_access"
    NCCL = "nccl"


class Origin(StrEnum):
    """The shipped file holding a text, so a test can find it in the installed torch stack."""

    CUDART = "libcudart"  # cudaGetErrorString texts (nvidia/cu*/lib/libcudart.so)
    NCCL = "libnccl"  # ncclGetErrorString texts and NCCL's log lines (nvidia/nccl/lib/libnccl.so)
    C10_CUDA = "libc10_cuda"  # torch/lib/libc10_cuda.so
    TORCH_CUDA = "libtorch_cuda"  # torch/lib/libtorch_cuda.so (ProcessGroupNCCL)
    TORCH_PYTHON = "torch/cuda/__init__.py"
    OLDER_RELEASE = "older release"  # printed by earlier torch or CUDA releases only: see the source


@dataclass(frozen=True)
class KnownText:
    kind: Kind
    text: str  # a fragment of the real message, matched case-insensitively
    origin: Origin
    source: str  # the source file, the CUDA error code, or an issue showing the whole message


# Checked in order: the first match wins, so specific causes come before generic NCCL wrappers
# (an NCCL error usually carries the CUDA error that caused it).
KNOWN_TEXTS: tuple[KnownText, ...] = (
    # -- the driver is older than the CUDA this torch was built with -----------------------------
    KnownText(
        Kind.DRIVER,
        "The NVIDIA driver on your system is too old",
        Origin.C10_CUDA,
        "c10/cuda/CUDAFunctions.cpp; github.com/lllyasviel/Fooocus/issues/1313",
    ),
    KnownText(
        Kind.DRIVER,
        "CUDA driver version is insufficient for CUDA runtime version",
        Origin.CUDART,
        "cudaErrorInsufficientDriver (35); github.com/NVIDIA/nvidia-docker/issues/700",
    ),
    KnownText(
        Kind.DRIVER,
        "forward compatibility was attempted on non supported HW",
        Origin.CUDART,
        "cudaErrorCompatNotSupportedOnDevice (804)",
    ),
    KnownText(
        Kind.DRIVER,
        "the provided PTX was compiled with an unsupported toolchain",
        Origin.CUDART,
        "cudaErrorUnsupportedPtxVersion (222)",
    ),
    KnownText(
        Kind.DRIVER,
        "system has unsupported display driver / cuda driver combination",
        Origin.CUDART,
        "cudaErrorSystemDriverMismatch (803)",
    ),
    # -- torch has no kernels for this card --------------------------------------------------------
    KnownText(
        Kind.ARCH,
        "no kernel image is available for execution on the device",
        Origin.CUDART,
        "cudaErrorNoKernelImageForDevice (209); github.com/pytorch/pytorch/issues/167244",
    ),
    KnownText(
        Kind.ARCH,
        "is not compatible with the current PyTorch installation",
        Origin.TORCH_PYTHON,
        "torch/cuda/__init__.py _check_cubins; github.com/pytorch/pytorch/issues/150733",
    ),
    KnownText(
        Kind.ARCH,
        "does not include kernels for this GPU",
        Origin.TORCH_PYTHON,
        "torch/cuda/__init__.py _warn_unsupported_code (torch 2.14)",
    ),
    KnownText(
        Kind.ARCH,
        "PyTorch no longer supports this GPU because it is too old",
        Origin.OLDER_RELEASE,
        "torch/cuda/__init__.py _check_capability before torch 2.10",
    ),
    KnownText(Kind.ARCH, "device kernel image is invalid", Origin.CUDART, "cudaErrorInvalidKernelImage (200)"),
    KnownText(
        Kind.CPU_BUILD,
        "Torch not compiled with CUDA enabled",
        Origin.TORCH_PYTHON,
        "torch/cuda/__init__.py _lazy_init: a CPU-only torch wheel",
    ),
    # -- no GPU reaches the container --------------------------------------------------------------
    KnownText(
        Kind.NO_GPU,
        "Found no NVIDIA driver on your system",
        Origin.C10_CUDA,
        "c10/cuda/CUDAFunctions.cpp: a container started without a GPU",
    ),
    KnownText(Kind.NO_GPU, "no CUDA-capable device is detected", Origin.CUDART, "cudaErrorNoDevice (100)"),
    KnownText(
        Kind.NO_GPU,
        "CUDA driver initialization failed, you might not have a CUDA gpu",
        Origin.C10_CUDA,
        "c10/cuda/CUDAFunctions.cpp",
    ),
    # -- the machine is not ready, or not ours alone -----------------------------------------------
    KnownText(
        Kind.NOT_READY,
        "system not yet initialized",
        Origin.CUDART,
        "cudaErrorSystemNotReady (802): NVSwitch machines without a running fabric manager; "
        "github.com/pytorch/pytorch/issues/35710, github.com/huggingface/huggingface_hub/issues/4134",
    ),
    KnownText(
        Kind.BUSY,
        "CUDA-capable device(s) is/are busy or unavailable",
        Origin.CUDART,
        "cudaErrorDevicesUnavailable (46): exclusive-process mode with another process on the card",
    ),
    KnownText(
        Kind.BUSY,
        "all CUDA-capable devices are busy or unavailable",
        Origin.OLDER_RELEASE,
        "the same error (46) in CUDA before 12; github.com/pytorch/pytorch/issues/2704",
    ),
    KnownText(Kind.OUT_OF_MEMORY, "out of memory", Origin.CUDART, "cudaErrorMemoryAllocation (2)"),
    # -- broken hardware ---------------------------------------------------------------------------
    KnownText(Kind.FAULTY, "uncorrectable ECC error encountered", Origin.CUDART, "cudaErrorECCUncorrectable (214)"),
    KnownText(
        Kind.FAULTY,
        "uncorrectable NVLink error detected during the execution",
        Origin.CUDART,
        "cudaErrorNvlinkUncorrectable (220)",
    ),
    KnownText(Kind.FAULTY, "unspecified launch failure", Origin.CUDART, "cudaErrorLaunchFailure (719)"),
    KnownText(Kind.FAULTY, "an illegal memory access was encountered", Origin.CUDART, "cudaErrorIllegalAddress (700)"),
    KnownText(Kind.FAULTY, "the launch timed out and was terminated", Origin.CUDART, "cudaErrorLaunchTimeout (702)"),
    KnownText(Kind.FAULTY, "hardware stack error", Origin.CUDART, "cudaErrorHardwareStackError (714)"),
    # -- GPU-to-GPU communication ------------------------------------------------------------------
    KnownText(
        Kind.PEER_ACCESS,
        "peer access is not supported between these two devices",
        Origin.CUDART,
        "cudaErrorPeerAccessUnsupported (217), printed by NCCL's transport/p2p.cc; "
        "github.com/ray-project/ray_lightning/issues/24",
    ),
    KnownText(
        Kind.PEER_ACCESS,
        "P2P is disabled between connected GPUs",
        Origin.NCCL,
        "an NCCL INFO line; github.com/pytorch/pytorch/issues/130113",
    ),
    KnownText(
        Kind.NCCL,
        "Watchdog caught collective operation timeout",
        Origin.TORCH_CUDA,
        "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; github.com/NVIDIA/Megatron-LM/issues/1207",
    ),
    KnownText(
        Kind.NCCL,
        "unhandled cuda error",
        Origin.NCCL,
        "ncclUnhandledCudaError (ncclGetErrorString); github.com/pytorch/pytorch/issues/19925",
    ),
    KnownText(Kind.NCCL, "unhandled system error", Origin.NCCL, "ncclSystemError (ncclGetErrorString)"),
    KnownText(
        Kind.NCCL,
        "remote process exited or there was a network error",
        Origin.NCCL,
        "ncclRemoteError (ncclGetErrorString)",
    ),
    KnownText(
        Kind.NCCL,
        "internal error - please report this issue to the NCCL developers",
        Origin.NCCL,
        "ncclInternalError (ncclGetErrorString)",
    ),
    KnownText(
        Kind.NCCL, "NCCL error", Origin.TORCH_CUDA, "torch/csrc/distributed/c10d/NCCLUtils.hpp ('NCCL error in: ')"
    ),
    KnownText(Kind.NCCL, "DistBackendError", Origin.TORCH_CUDA, "c10::DistBackendError, raised by ProcessGroupNCCL"),
)


def match(text: str) -> KnownText | None:
    """The first known text found in ``text``, if any."""
    lowered = text.lower()
    for known in KNOWN_TEXTS:
        if known.text.lower() in lowered:
            return known
    return None


# -- what runs where ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageVariant:
    """A build of the image: which torch CUDA build it carries, which cards and drivers it serves."""

    name: str
    cuda: str
    code_sms: frozenset[int]  # the sm_XY torch ships machine code for
    min_driver: str


# torch 2.14 publishes x86_64 wheels for CUDA 12.6 (sm_50-sm_90) and 13.0 (sm_75-sm_120): see
# PYTORCH_RELEASES_CODE_CC in torch/cuda/__init__.py. Minimum drivers: NVIDIA's "CUDA minor version
# compatibility" table, docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
# (CUDA 13.x >= 580, 12.x >= 525.60.13, 11.x >= 450.80.02, the exact versions from the toolkits'
# release notes, docs.nvidia.com/cuda/cuda-toolkit-release-notes).
IMAGE_VARIANTS: tuple[ImageVariant, ...] = (
    ImageVariant("cu130", "13.0", frozenset({75, 80, 86, 90, 100, 120}), "580.65.06"),
    ImageVariant("cu126", "12.6", frozenset({50, 60, 70, 75, 80, 86, 90}), "525.60.13"),
)
MIN_DRIVER_FOR_CUDA_MAJOR: dict[int, str] = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
# Integrated (Jetson) GPUs whose code runs on no other card: torch's DEVICE_REQUIREMENT table.
_IGPU_ONLY = frozenset({53, 62, 72, 87, 101, 110})


def sm_number(capability: tuple[int, int]) -> int:
    return capability[0] * 10 + capability[1]


def _runs_on(code_sm: int, device_sm: int) -> bool:
    """Machine code for ``code_sm`` runs on ``device_sm``: same major, not newer minor (CUDA's rule)."""
    if code_sm in _IGPU_ONLY or device_sm in _IGPU_ONLY:
        return code_sm == device_sm
    return code_sm // 10 == device_sm // 10 and code_sm % 10 <= device_sm % 10


def _arch_number(arch: str) -> int | None:
    found = re.fullmatch(r"(?:sm|compute)_(\d+)[a-z]?", arch)
    return int(found.group(1)) if found else None


def arch_supported(capability: tuple[int, int], arch_list: Iterable[str]) -> bool:
    """Whether torch, built for ``arch_list`` (``torch.cuda.get_arch_list()``), has kernels for this card.

    ``sm_XY`` entries are machine code (same major, minor not above the card's); ``compute_XY``
    entries are PTX, which the driver compiles for any newer card.
    """
    device = sm_number(capability)
    for arch in arch_list:
        number = _arch_number(arch)
        if number is None:
            continue
        if arch.startswith("sm_") and _runs_on(number, device):
            return True
        if arch.startswith("compute_") and number <= device and device not in _IGPU_ONLY:
            return True
    return False


def variants_for(capability: tuple[int, int]) -> list[ImageVariant]:
    device = sm_number(capability)
    return [variant for variant in IMAGE_VARIANTS if any(_runs_on(sm, device) for sm in variant.code_sms)]


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"580.95.05"`` → (580, 95, 5); None when there is no number to read."""
    if not text:
        return None
    found = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def parse_driver_version(text: str) -> str | None:
    """The driver version in ``nvidia-smi`` output or ``/proc/driver/nvidia/version``."""
    proc = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if proc:
        return proc.group(1)
    plain = re.search(r"^\s*(\d+\.\d+(?:\.\d+)?)\s*$", text, re.MULTILINE)
    return plain.group(1) if plain else None


def min_driver_for(cuda: str | None) -> str | None:
    version = parse_version(cuda)
    return MIN_DRIVER_FOR_CUDA_MAJOR.get(version[0]) if version else None


def _driver_cuda(text: str) -> str | None:
    """torch prints the driver's CUDA API version, e.g. ``found version 12040`` → ``12.4``."""
    found = re.search(r"found version (\d+)", text)
    if not found:
        return None
    number = int(found.group(1))
    return f"{number // 1000}.{number % 1000 // 10}"


# -- text → typed error ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the check knows around a failure, to name the fix precisely."""

    where: str = "the GPU check"  # e.g. "GPU 1 (NVIDIA A100-SXM4-80GB)"
    cuda: str | None = None  # torch.version.cuda
    driver: str | None = None
    capability: tuple[int, int] | None = None
    arch_list: tuple[str, ...] = field(default_factory=tuple)


def first_line(text: str, limit: int = 200) -> str:
    """The telling line of a (multi-line) error text, trimmed, for one-line messages."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "no error text"
    for candidate in lines:
        if match(candidate):
            line = candidate
            break
    return line if len(line) <= limit else line[: limit - 1] + "…"


def architecture_error(facts: Facts) -> GpuArchitectureError:
    assert facts.capability is not None
    sm = sm_number(facts.capability)
    built = " ".join(facts.arch_list) or "unknown"
    message = f"{facts.where} is sm_{sm}, and this image's torch (CUDA {facts.cuda}) has kernels only for {built}"
    fits = [variant for variant in variants_for(facts.capability) if variant.cuda != facts.cuda]
    if fits:
        names = " or ".join(
            f"{variant.name} variant (torch for CUDA {variant.cuda}, driver >= {variant.min_driver})"
            for variant in fits
        )
        hint = f"use the image's {names}, or rent a card this image supports"
    else:
        hint = f"no current torch build runs on sm_{sm}: rent a newer card (compute capability 7.5 or later)"
    return GpuArchitectureError(message, hint)


def driver_error(text: str, facts: Facts) -> GpuDriverError:
    need = min_driver_for(facts.cuda)
    driver_cuda = _driver_cuda(text)
    have = f"driver {facts.driver}" if facts.driver else "the driver"
    if driver_cuda:
        have += f" (supports CUDA up to {driver_cuda})"
    message = f"{have} is too old for this image's torch, built for CUDA {facts.cuda}: {first_line(text, 120)}"
    hint = f"rent a machine with NVIDIA driver >= {need}" if need else "rent a machine with a newer NVIDIA driver"
    driver = parse_version(facts.driver)
    # Suggest an older build only when it also has kernels for this card.
    fitting = variants_for(facts.capability) if facts.capability is not None else []
    older = [
        variant
        for variant in fitting
        if variant.cuda != facts.cuda and driver is not None and driver >= (parse_version(variant.min_driver) or ())
    ]
    if older:
        hint += f", or use the image's {older[0].name} variant (needs driver >= {older[0].min_driver})"
    return GpuDriverError(message, hint)


def classify(text: str, facts: Facts, *, nccl: bool = False) -> GpuError:
    """The typed error for a raw failure ``text`` seen at ``facts.where``; ``nccl`` for the all-reduce."""
    known = match(text)
    line = first_line(text)
    kind = known.kind if known else (Kind.NCCL if nccl else None)
    match kind:
        case Kind.DRIVER:
            return driver_error(text, facts)
        case Kind.ARCH if facts.capability is not None:
            return architecture_error(facts)
        case Kind.ARCH:
            return GpuArchitectureError(
                f"{facts.where}: this image's torch (CUDA {facts.cuda}) has no kernels for the card: {line}",
                "run `trainbox check` to see the card's architecture and the image variant that fits",
            )
        case Kind.CPU_BUILD:
            return GpuArchitectureError(
                f"{facts.where} failed: the installed torch is a CPU-only build ({line})",
                "use the Trainbox image, whose torch is built for CUDA, or set GPUS=cpu",
            )
        case Kind.NO_GPU:
            return NoGpuError(
                f"no NVIDIA GPU is visible in this container ({line})",
                "start it with a GPU (docker run --gpus all; the provider's GPU template), or set GPUS=cpu",
            )
        case Kind.NOT_READY:
            return GpuError(
                f"{facts.where} failed: {line}",
                "the machine's NVIDIA fabric manager (needed on NVSwitch systems) is not running: "
                "ask the provider for another machine",
            )
        case Kind.BUSY:
            return GpuError(
                f"{facts.where} failed: {line}",
                "another process holds the card (exclusive-process mode): stop it, or leave the card out with GPUS",
            )
        case Kind.OUT_OF_MEMORY:
            return GpuError(
                f"{facts.where} failed: {line}",
                "another process holds the card's memory: stop it, or leave the card out with GPUS",
            )
        case Kind.FAULTY:
            return GpuError(f"{facts.where} failed: {line}", "the card is faulty: ask the provider for another machine")
        case Kind.PEER_ACCESS | Kind.NCCL:
            return NcclError(f"{facts.where} failed: {line}", P2P_ADVICE)
    return GpuError(
        f"{facts.where} failed: {line}", "ask the provider for another machine (`trainbox check` shows more)"
    )
