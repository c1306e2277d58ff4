"""The GPU failure classification, against the texts torch, CUDA and NCCL really print.

Two kinds of evidence: every known text is looked up in the installed torch stack's own files
(so a torch upgrade that rewords a message fails here), and whole messages as users reported
them in issue trackers are classified into the right error with the right fix.
"""

from __future__ import annotations

import ast
import importlib.util
import mmap
from pathlib import Path

import pytest

from entrypoint.errors import GpuArchitectureError, GpuDriverError, GpuError, NcclError, NoGpuError
from entrypoint.gpu import causes as gpu_causes
from entrypoint.gpu.causes import Facts, Origin

# torch.cuda.get_arch_list() of the two torch 2.14 builds the image variants carry.
CU130_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
CU126_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent if spec and spec.origin else None


def _origin_files(origin: Origin) -> list[Path]:
    torch_dir = _torch_dir()
    if torch_dir is None:
        return []
    site = torch_dir.parent
    patterns = {
        Origin.CUDART: [site.glob("nvidia/cu*/lib/libcudart.so*"), site.glob("nvidia/cuda_runtime/lib/libcudart.so*")],
        Origin.NCCL: [site.glob("nvidia/nccl/lib/libnccl.so*")],
        Origin.C10_CUDA: [torch_dir.glob("lib/libc10_cuda.so")],
        Origin.TORCH_CUDA: [torch_dir.glob("lib/libtorch_cuda.so")],
        Origin.TORCH_PYTHON: [torch_dir.glob("cuda/__init__.py")],
    }
    return [path for found in patterns.get(origin, []) for path in found]


def _contains(path: Path, text: str) -> bool:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(text.encode()) >= 0


SHIPPED = [known for known in gpu_causes.KNOWN_TEXTS if known.origin is not Origin.OLDER_RELEASE]


@pytest.mark.parametrize("known", SHIPPED, ids=lambda known: known.text[:40])
def test_known_text_is_printed_by_the_installed_torch_stack(known: gpu_causes.KnownText) -> None:
    files = _origin_files(known.origin)
    if not files:
        pytest.skip(f"this environment's torch has no {known.origin} (a CPU-only build)")
    assert any(_contains(path, known.text) for path in files), f"{known.text!r} not found in {files}"


def test_older_release_texts_cite_an_issue() -> None:
    for known in gpu_causes.KNOWN_TEXTS:
        if known.origin is Origin.OLDER_RELEASE:
            assert "issues/" in known.source or "before torch" in known.source


def test_image_variants_match_the_builds_torch_publishes() -> None:
    """Our small table against torch's own list of release builds (read, not imported)."""
    torch_dir = _torch_dir()
    if torch_dir is None:
        pytest.skip("torch is not installed")
    tree = ast.parse((torch_dir / "cuda" / "__init__.py").read_text())
    releases = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "PYTORCH_RELEASES_CODE_CC"
    )
    for variant in gpu_causes.IMAGE_VARIANTS:
        assert releases[variant.cuda]["x86_64"] == set(variant.code_sms), variant.name
        assert variant.min_driver == gpu_causes.MIN_DRIVER_FOR_CUDA_MAJOR[int(variant.cuda.split(".")[0])]


# -- whole messages as reported -------------------------------------------------------------------

# github.com/pytorch/pytorch/issues/167244 and github.com/Janrupf/stable-diffusion-webui-nix/issues/9
RTX5090_WARNING = (
    "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.\n"
    "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.\n"
    "If you want to use the NVIDIA GeForce RTX 5090 GPU with PyTorch, please check the instructions at "
    "https://pytorch.org/get-started/locally/"
)
NO_KERNEL_IMAGE = (
    "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)
# github.com/lllyasviel/Fooocus/issues/1313 (nvidia-smi there: driver 470.86, CUDA 11.4)
DRIVER_TOO_OLD_470 = (
    "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver "
    "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
    "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your version "
    "of the CUDA driver."
)
# github.com/NVIDIA/DeepLearningExamples/issues/251
INSUFFICIENT_DRIVER = (
    "RuntimeError: CUDA runtime API error cudaErrorInsufficientDriver (35):\n"
    "CUDA driver version is insufficient for CUDA runtime version"
)
# What torch 2.14.1 says on this kind of machine: a container without a GPU.
NO_DRIVER = (
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
    "driver from http://www.nvidia.com/Download/index.aspx"
)
# github.com/huggingface/huggingface_hub/issues/4134 (an H200 whose fabric manager never came up)
FABRIC_NOT_READY = (
    "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"
)
# github.com/ray-project/ray_lightning/issues/24 (NCCL_DEBUG=INFO output included)
NCCL_PEER_ACCESS = (
    "RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1603729062494/work/torch/lib/c10d/"
    "ProcessGroupNCCL.cpp:784, unhandled cuda error, NCCL version 2.7.8\n"
    "z-pc:909608:910337 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 peer access is not "
    "supported between these two devices"
)
NCCL_WITHOUT_DETAIL = NCCL_PEER_ACCESS.splitlines()[0]
# github.com/hiyouga/LlamaFactory/issues/7396
NCCL_WATCHDOG = (
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
    "ran for 600060 milliseconds before timing out."
)
# github.com/huggingface/accelerate/issues/1192
ECC = (
    "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call,so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1."
)
# github.com/pytorch/pytorch/issues/100691
BUSY = (
    "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect."
)
# github.com/pytorch/pytorch/issues/2704 (CUDA 8)
BUSY_OLD = (
    "RuntimeError: cuda runtime error (46) : all CUDA-capable devices are busy or unavailable at "
    "/opt/conda/conda-bld/pytorch_1502004572321/work/torch/lib/THC/generic/THCStorage.cu:66"
)


def test_sm120_on_a_cu126_build_names_the_cu130_variant() -> None:
    facts = Facts(where="GPU 0 (NVIDIA GeForce RTX 5090)", cuda="12.6", capability=(12, 0), arch_list=CU126_ARCHS)
    for text in (RTX5090_WARNING, NO_KERNEL_IMAGE):
        error = gpu_causes.classify(text, facts)
        assert isinstance(error, GpuArchitectureError)
        assert error.exit_code == 52
        assert "sm_120" in error.message and "GPU 0 (NVIDIA GeForce RTX 5090)" in error.message
        assert "cu130" in error.hint and "cu126" not in error.hint


def test_pascal_on_this_image_names_the_cu126_variant() -> None:
    facts = Facts(where="GPU 0 (Tesla P40)", cuda="13.0", capability=(6, 1), arch_list=CU130_ARCHS)
    error = gpu_causes.classify(NO_KERNEL_IMAGE, facts)
    assert isinstance(error, GpuArchitectureError)
    assert "sm_61" in error.message
    assert "cu126" in error.hint


def test_a_card_no_build_supports_says_so() -> None:
    error = gpu_causes.architecture_error(Facts(where="GPU 0 (Tesla K80)", cuda="13.0", capability=(3, 7)))
    assert "no current torch build runs on sm_37" in error.hint


def test_arch_error_without_capability_still_points_at_the_check() -> None:
    error = gpu_causes.classify(NO_KERNEL_IMAGE, Facts(where="CUDA initialisation", cuda="13.0"))
    assert isinstance(error, GpuArchitectureError)
    assert "trainbox check" in error.hint


def test_driver_too_old_names_the_minimum_driver() -> None:
    facts = Facts(where="CUDA initialisation", cuda="13.0", driver="470.86", capability=(8, 6))
    error = gpu_causes.classify(DRIVER_TOO_OLD_470, facts)
    assert isinstance(error, GpuDriverError)
    assert error.exit_code == 53
    assert "driver 470.86 (supports CUDA up to 11.4)" in error.message
    assert "CUDA 13.0" in error.message
    assert ">= 580.65.06" in error.hint
    assert "cu126" not in error.hint  # 470 is too old for CUDA 12 as well


def test_driver_new_enough_for_cuda_12_offers_the_cu126_variant() -> None:
    text = DRIVER_TOO_OLD_470.replace("11040", "12040")
    facts = Facts(where="CUDA initialisation", cuda="13.0", driver="550.54.15", capability=(8, 9))
    error = gpu_causes.classify(text, facts)
    assert isinstance(error, GpuDriverError)
    assert "supports CUDA up to 12.4" in error.message
    assert "cu126 variant (needs driver >= 525.60.13)" in error.hint


def test_cu126_is_not_offered_to_a_card_it_has_no_kernels_for() -> None:
    facts = Facts(where="CUDA initialisation", cuda="13.0", driver="570.124.06", capability=(10, 0))
    error = gpu_causes.classify(DRIVER_TOO_OLD_470.replace("11040", "12080"), facts)
    assert ">= 580.65.06" in error.hint
    assert "cu126" not in error.hint


def test_insufficient_driver_from_the_cuda_runtime() -> None:
    error = gpu_causes.classify(INSUFFICIENT_DRIVER, Facts(cuda="13.0", driver="535.183.01"))
    assert isinstance(error, GpuDriverError)
    assert "driver 535.183.01" in error.message


def test_a_cpu_only_torch_is_an_image_problem() -> None:
    # torch/cuda/__init__.py _lazy_init, as a CPU wheel raises it
    text = "AssertionError: Torch not compiled with CUDA enabled"
    error = gpu_causes.classify(text, Facts(where="CUDA initialisation"))
    assert isinstance(error, GpuArchitectureError)
    assert "CPU-only build" in error.message and "GPUS=cpu" in error.hint


def test_no_driver_in_the_container_is_no_gpu() -> None:
    error = gpu_causes.classify(NO_DRIVER, Facts(where="CUDA initialisation", cuda="13.0"))
    assert isinstance(error, NoGpuError)
    assert error.exit_code == 51
    assert "--gpus all" in error.hint and "GPUS=cpu" in error.hint


def test_fabric_manager_not_running() -> None:
    error = gpu_causes.classify(FABRIC_NOT_READY, Facts(where="CUDA initialisation", cuda="13.0"))
    assert type(error) is GpuError
    assert "system not yet initialized" in error.message
    assert "fabric manager" in error.hint


@pytest.mark.parametrize("text", [NCCL_PEER_ACCESS, NCCL_WITHOUT_DETAIL, NCCL_WATCHDOG])
def test_nccl_failures_advise_disabling_p2p(text: str) -> None:
    error = gpu_causes.classify(text, Facts(where="the NCCL all-reduce across GPUs 0,1"), nccl=True)
    assert isinstance(error, NcclError)
    assert error.exit_code == 55
    assert "NCCL_P2P_DISABLE=1" in error.hint


def test_peer_access_line_is_picked_as_the_cause() -> None:
    assert "peer access is not supported" in gpu_causes.first_line(NCCL_PEER_ACCESS.splitlines()[1])
    error = gpu_causes.classify(NCCL_PEER_ACCESS, Facts(where="the all-reduce"), nccl=True)
    assert gpu_causes.match(NCCL_PEER_ACCESS).kind is gpu_causes.Kind.PEER_ACCESS
    assert "\n" not in str(error)


@pytest.mark.parametrize(("text", "fix"), [(ECC, "faulty"), (BUSY, "another process"), (BUSY_OLD, "another process")])
def test_hardware_and_sharing_problems(text: str, fix: str) -> None:
    error = gpu_causes.classify(text, Facts(where="GPU 3 (NVIDIA A100-SXM4-80GB)"))
    assert type(error) is GpuError
    assert error.message.startswith("GPU 3 (NVIDIA A100-SXM4-80GB)")
    assert fix in error.message + error.hint


def test_unknown_text_keeps_its_first_line() -> None:
    error = gpu_causes.classify("RuntimeError: something new\nmore detail", Facts(where="GPU 1"))
    assert type(error) is GpuError
    assert error.message == "GPU 1 failed: RuntimeError: something new"


def test_unknown_text_in_the_all_reduce_is_an_nccl_error() -> None:
    error = gpu_causes.classify("RuntimeError: something new", Facts(where="the all-reduce"), nccl=True)
    assert isinstance(error, NcclError)


def test_every_message_is_one_line() -> None:
    facts = Facts(where="GPU 0", cuda="13.0", driver="470.86", capability=(8, 6), arch_list=CU130_ARCHS)
    for text in (RTX5090_WARNING, NO_KERNEL_IMAGE, DRIVER_TOO_OLD_470, NO_DRIVER, NCCL_PEER_ACCESS, ECC, BUSY):
        assert "\n" not in str(gpu_causes.classify(text, facts))


# -- architecture and version arithmetic ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "archs", "supported"),
    [
        ((9, 0), CU130_ARCHS, True),  # H100/H200
        ((8, 9), CU130_ARCHS, True),  # L4, L40S, RTX 4090: sm_86 code runs on 8.9
        ((10, 3), CU130_ARCHS, True),  # B300: sm_100 code
        ((12, 1), CU130_ARCHS, True),  # GB10: sm_120 code
        ((6, 1), CU130_ARCHS, False),  # P40, GTX 1080
        ((7, 0), CU130_ARCHS, False),  # V100
        ((7, 0), CU126_ARCHS, True),
        ((12, 0), CU126_ARCHS, False),  # RTX 5090 on a CUDA 12.6 build
        ((8, 7), CU130_ARCHS, False),  # Jetson Orin: its own code only
        ((10, 0), ("sm_80", "compute_90"), True),  # PTX compiles for newer cards
        ((8, 6), ("sm_80", "compute_90"), True),
        ((8, 0), ("compute_90",), False),  # but not for older ones
    ],
)
def test_arch_supported(capability: tuple[int, int], archs: tuple[str, ...], supported: bool) -> None:
    assert gpu_causes.arch_supported(capability, archs) is supported


def test_variants_for_cards() -> None:
    assert [v.name for v in gpu_causes.variants_for((9, 0))] == ["cu130", "cu126"]
    assert [v.name for v in gpu_causes.variants_for((12, 0))] == ["cu130"]
    assert [v.name for v in gpu_causes.variants_for((6, 1))] == ["cu126"]
    assert gpu_causes.variants_for((3, 7)) == []


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("580.95.05\n580.95.05\n", "580.95.05"),  # nvidia-smi --query-gpu=driver_version, two cards
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
            "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n",
            "550.54.15",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n",
            "580.95.05",
        ),
        ("", None),
        ("No devices were found\n", None),
    ],
)
def test_parse_driver_version(text: str, version: str | None) -> None:
    assert gpu_causes.parse_driver_version(text) == version


def test_min_driver_for_cuda_builds() -> None:
    assert gpu_causes.min_driver_for("13.0") == "580.65.06"
    assert gpu_causes.min_driver_for("12.6") == "525.60.13"
    assert gpu_causes.min_driver_for(None) is None
    assert gpu_causes.parse_version("580.65.06") > gpu_causes.parse_version("525.60.13")
