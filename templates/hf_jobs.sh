#!/usr/bin/env bash
# Trainbox on Hugging Face Jobs: the published image on the Hub's GPUs, billed by the minute while the job runs.
# The bill ends with the job (ON_EXIT=exit); TIMEOUT bounds it (Jobs stop after 30 minutes without one).
#
#   pip install -U huggingface_hub && hf auth login       # once: a token that reads DATASET_REPO, writes OUTPUT_REPO
#   templates/hf_jobs.sh your-org/your-dataset your-org/your-model
#   FLAVOR=l40sx1 TIMEOUT=12h RUN_ARGS="model=LibreYOLO9m.pt epochs=300 imgsz=640" templates/hf_jobs.sh org/data org/model
#
# Your token reaches the job as the secret HF_TOKEN (`--secrets HF_TOKEN`: the value of $HF_TOKEN, else the token of
# `hf auth login`), never in the command line or its environment. Options after the two repos go to `hf jobs run`
# (e.g. --namespace your-org to bill an organisation). Follow the job with `hf jobs logs -f JOB_ID`, stop it with
# `hf jobs cancel JOB_ID` (the agent gets SIGTERM and uploads what it has). Running the same command again resumes
# the run from the Hub: every epoch is in OUTPUT_REPO's Storage Bucket (<OUTPUT_REPO>-checkpoints) and repo.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 DATASET_REPO OUTPUT_REPO [hf jobs run options...]" >&2
  exit 2
fi
DATASET_REPO=$1
OUTPUT_REPO=$2
shift 2

IMAGE=${IMAGE:-ghcr.io/libreyolo/trainbox:0.2.0} # a fixed release: a rerun resumes with the same image
RUN_ARGS=${RUN_ARGS:-model=LibreYOLO9s.pt epochs=100 imgsz=640}
FLAVOR=${FLAVOR:-a100-large} # `hf jobs hardware` lists them
TIMEOUT=${TIMEOUT:-6h}       # s, m, h or d
if ! [[ $TIMEOUT =~ ^[0-9]+[smhd]?$ ]]; then
  echo "hf_jobs.sh: TIMEOUT=$TIMEOUT: give a whole number with s, m, h or d (e.g. 6h)" >&2
  exit 2
fi
# The agent's own limit, 15 minutes short of TIMEOUT: the final upload and trainbox.json happen before the stop.
case $TIMEOUT in
  *d) timeout_s=$((${TIMEOUT%d} * 86400)) ;;
  *h) timeout_s=$((${TIMEOUT%h} * 3600)) ;;
  *m) timeout_s=$((${TIMEOUT%m} * 60)) ;;
  *s) timeout_s=${TIMEOUT%s} ;;
  *) timeout_s=$TIMEOUT ;;
esac
if [ "$timeout_s" -le 900 ]; then
  echo "hf_jobs.sh: TIMEOUT=$TIMEOUT leaves no time to train: give more than 15m (e.g. 6h)" >&2
  exit 2
fi
MAX_RUNTIME=${MAX_RUNTIME:-$(((timeout_s - 900) / 60))m}
# The flavor's hourly price, for the cost on the model card, the progress line and MAX_COST: the Hub's own, from
# `HfApi.list_jobs_hardware()` where the installed huggingface_hub has it (its unit cost × units an hour); else the
# table below (https://huggingface.co/docs/hub/jobs-pricing, read 2026-08-22).
listed=$(
  python3 - "$FLAVOR" 2>/dev/null <<'PY' || true
import sys

from huggingface_hub import HfApi

per_hour = {"second": 3600, "minute": 60, "hour": 1}
for hardware in HfApi().list_jobs_hardware():
    if hardware.name == sys.argv[1] and hardware.unit_cost_usd and hardware.unit_label in per_hour:
        print(f"{hardware.unit_cost_usd * per_hour[hardware.unit_label]:.4g}")
PY
)
case $FLAVOR in
  t4-small) price=0.40 ;;
  t4-medium) price=0.60 ;;
  l4x1) price=0.80 ;;
  l4x4) price=3.80 ;;
  l40sx1) price=1.80 ;;
  l40sx4) price=8.30 ;;
  l40sx8) price=23.50 ;;
  a10g-small) price=1.00 ;;
  a10g-large) price=1.50 ;;
  a10g-largex2) price=3.00 ;;
  a10g-largex4) price=5.00 ;;
  a100-large) price=2.50 ;;
  a100x4) price=10.00 ;;
  a100x8) price=20.00 ;;
  h200) price=5.00 ;;
  h200x2) price=10.00 ;;
  h200x4) price=20.00 ;;
  h200x8) price=40.00 ;;
  rtx-pro-6000) price=2.75 ;;
  rtx-pro-6000x2) price=5.50 ;;
  rtx-pro-6000x4) price=11.00 ;;
  rtx-pro-6000x8) price=22.00 ;;
  *) price= ;;
esac
PRICE_PER_HOUR=${PRICE_PER_HOUR:-${listed:-$price}}
if [ -z "$PRICE_PER_HOUR" ]; then
  echo "hf_jobs.sh: no price known for FLAVOR=$FLAVOR: set PRICE_PER_HOUR (see \`hf jobs hardware\`)" >&2
  exit 2
fi

# The command replaces the image's entrypoint (Jobs run it as given): tini forwards SIGTERM and reaps children.
exec hf jobs run --detach --name trainbox \
  --flavor "$FLAVOR" --timeout "$TIMEOUT" \
  --secrets HF_TOKEN \
  --env "DATASET_REPO=$DATASET_REPO" \
  --env "OUTPUT_REPO=$OUTPUT_REPO" \
  --env "RUN_ARGS=$RUN_ARGS" \
  --env "GPUS=all" \
  --env "MAX_RUNTIME=$MAX_RUNTIME" \
  --env "PRICE_PER_HOUR=$PRICE_PER_HOUR" \
  --env "ON_EXIT=exit" \
  "$@" \
  "$IMAGE" tini trainbox run
