#!/usr/bin/env bash
# The GPU tests on a machine with an NVIDIA card, in one command, from the repository root:
#
#   bash tests/gpu/device.sh OUTDIR [WHEELS]     # WHEELS: default .gpu-wheels, made by tests/gpu/wheels.sh
#
# Installs this project, libreyolo and the packages the machine lacks from the carried wheels into a private
# folder (the machine's torch, torchvision and CUDA are never touched), checks that every requirement of what it
# installed is met, then runs `pytest -m gpu` with a time limit per test and for the whole run. Into OUTDIR (at
# most a few files, one level deep): env.txt (machine, driver, versions), check.txt (`trainbox check`), pytest.log,
# junit.xml, feeding-gpu.json (bench/feeding.py's figures) and logs.tar.gz (each test's trainbox.json and
# console.log). Exit: pytest's own code.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

OUT=${1:?usage: device.sh OUTDIR [WHEELS]}
WHEELS=${2:-.gpu-wheels}
PYTHON=${PYTHON:-python3}
PER_TEST=${GPU_TEST_TIMEOUT:-360}   # seconds per test (pytest-timeout, where the machine has it); feeding: ~4 min
WHOLE=${GPU_RUN_TIMEOUT:-600}       # seconds for the whole pytest run
SITE=${GPU_SITE:-/tmp/trainbox-site}
SCRATCH=${GPU_SCRATCH:-/tmp/trainbox-gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

echo "== install from $WHEELS into $SITE"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "no wheels in $WHEELS: run tests/gpu/wheels.sh where pip can download" >&2
    exit 2
fi
rm -rf "$SITE" "$SCRATCH"
"$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}" ||
    exit 2
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
# The carried packages' own requirements, against what the machine has: a missing one ends the run here, with
# its name, instead of as an ImportError in every test.
"$PYTHON" - "$SITE" <<'PY' || exit 2
import importlib.metadata as md
import pathlib
import sys

from packaging.requirements import Requirement

site, missing, other = pathlib.Path(sys.argv[1]), [], []
carried = [md.PathDistribution(p) for p in site.glob("*.dist-info")]
for dist in carried:
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower().replace("_", "-") in {"opencv-python", "torch", "torchvision"}:
            continue  # the machine's own builds (OpenCV headless) serve
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            missing.append(f"{req} (for {dist.metadata['Name']})")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            other.append(f"{req.name} {have} where {dist.metadata['Name']} asks {req.specifier}")
for line in other:
    print(f"note: {line}")
if missing:
    sys.exit("missing on this machine, carry them (tests/gpu/wheels.sh PACKAGES): " + "; ".join(missing))
print(f"{len(carried)} carried packages, their requirements met")
PY

{
    echo "date: $(date -u +%FT%TZ)"
    uname -a
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
        --format=csv 2>&1
    "$PYTHON" - <<'PY'
import importlib.metadata as md
import sys
print("python", sys.version.split()[0])
for name in ("trainbox", "libreyolo", "torch", "torchvision", "huggingface_hub", "hf_xet", "typer", "numpy"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

mkdir -p "$SCRATCH"
echo "== trainbox check"
WORKDIR="$SCRATCH/check" timeout 300 "$PYTHON" -m entrypoint check 2>&1 | tee "$OUT/check.txt"

echo "== pytest -m gpu (per test ${PER_TEST}s, whole run ${WHOLE}s)"
limits=()
if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
    limits=(--timeout "$PER_TEST")  # the plugin loads itself through its entry point
fi
# Warnings stay visible but are not errors here: this run proves GPU behaviour, and the machine's own packages
# (another torch, another numpy) warn about things CI never sees.
export GPU_RESULTS_DIR="$OUT"  # tests/gpu/test_feeding.py writes its figures there (feeding-gpu.json)
# -o addopts=: one process, one test at a time on the card (pyproject.toml's -n 4 needs pytest-xdist, not carried).
timeout -k 10 "$WHOLE" "$PYTHON" -m pytest tests/gpu -m gpu -s -v -W default -p no:cacheprovider -o addopts= \
    --basetemp "$SCRATCH/pytest" --junitxml "$OUT/junit.xml" "${limits[@]}" 2>&1 | tee "$OUT/pytest.log"
code=${PIPESTATUS[0]}

# Every run folder the tests left: what the agent recorded and printed.
(cd "$SCRATCH" && find . \( -name trainbox.json -o -name console.log -o -name train_config.yaml \) -print0 |
    tar --null -czf "$OUT/logs.tar.gz" -T -) 2>/dev/null
echo "== pytest exit $code; report in $OUT"
exit "$code"
