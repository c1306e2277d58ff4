#!/usr/bin/env bash
# Fetch the wheels that tests/gpu/device.sh installs on a GPU machine that cannot download anything.
#
#   bash tests/gpu/wheels.sh [DIR]        # default DIR: .gpu-wheels (ignored by git)
#
# The GPU machine brings Python, torch, torchvision and the common scientific stack (numpy, Pillow, OpenCV
# headless, matplotlib, scipy, PyYAML, requests, tqdm, typer, safetensors, cloudpickle, pytest). What it lacks,
# or has in another version than the one this project is tested with, travels as wheels: this project itself,
# libreyolo and the packages listed below, at the versions installed in this checkout's .venv (so the card runs
# what CI runs), for the machine's platform and Python (TARGET_PYTHON, default 3.12; x86_64 manylinux).
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${1:-.gpu-wheels}
PYTHON=${PYTHON:-.venv/bin/python}
TARGET_PYTHON=${TARGET_PYTHON:-3.12}
# Carried: missing there, or pinned to what is tested here. Not carried: torch, torchvision and CUDA (the
# machine's own build must stay), opencv-python (libreyolo's requirement; the machine's headless build serves).
PACKAGES=(
    libreyolo mss pycocotools
    huggingface_hub hf_xet httpx2 httpcore2 truststore anyio idna click
    watchdog
    apprise requests-oauthlib oauthlib markdown
    onnx onnxruntime protobuf ml_dtypes flatbuffers
    pyarrow
)
# What such a machine provides (tests/unit/test_gpu_scripts.py checks that every runtime requirement is in one of
# the two lists, so a new dependency gets a decision here).
PROVIDED=(
    torch torchvision opencv-python numpy pillow scipy matplotlib pyyaml requests tqdm typer safetensors
    cloudpickle packaging filelock fsspec typing-extensions h11 pytest urllib3 certifi
)

if [ ! -x "$PYTHON" ]; then
    echo "no $PYTHON: create the environment first (bash .ci/run, or README's first command)" >&2
    exit 2
fi

pins=()
for name in "${PACKAGES[@]}"; do
    version=$("$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name") || {
        echo "$name is not installed in $PYTHON's environment" >&2
        exit 2
    }
    pins+=("$name==$version")
done

rm -rf "$DIR"
mkdir -p "$DIR"
echo "== expected on the GPU machine already: ${PROVIDED[*]}"
echo "== downloading for CPython $TARGET_PYTHON, manylinux x86_64: ${pins[*]}"
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
    manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" \
    --implementation cp "${platforms[@]}" --platform any -d "$DIR" "${pins[@]}"

echo "== building this project's wheel"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DIR" .

echo "== $DIR"
find "$DIR" -name '*.whl' -printf '%s %f\n' | sort -k 2 | awk '{printf "%8.1f MB  %s\n", $1 / 1048576, $2}'
total=$(du -cb "$DIR"/*.whl | tail -n 1 | cut -f 1)
awk -v t="$total" 'BEGIN {printf "%8.1f MB  in all (a device call carries at most 64 MiB with the working tree)\n", t / 1048576}'
