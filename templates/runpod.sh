#!/usr/bin/env bash
# Trainbox on RunPod in one command: a pod made through RunPod's REST API v2 runs the published image, trains,
# puts every epoch on the Hub, then deletes itself (ON_EXIT=destroy, with the pod's own RUNPOD_API_KEY).
#
#   export RUNPOD_API_KEY=...   # once: an account API key that may create pods (RunPod console > Settings > API Keys)
#   # once: RunPod console > Secrets: a secret named HF_TOKEN holding a Hugging Face token that reads the dataset
#   # repo and writes the model repo. The pod gets it as {{ RUNPOD_SECRET_HF_TOKEN }}: it is never in the request.
#   templates/runpod.sh your-org/your-dataset your-org/your-model
#   RUN_ARGS="model=LibreYOLO9m.pt epochs=300 imgsz=640" templates/runpod.sh org/data org/model \
#     --gpu "NVIDIA H100 80GB HBM3" --count 2 --price-max 6 --disk 200 --cloud COMMUNITY
#
# --gpu is a RunPod GPU type id (GET /v2/catalog/gpus lists them); --price-max refuses a GPU whose list price for the
# pod ($/h, all its GPUs) is above it; --disk is the /workspace volume in GB (2.5x the dataset tar plus 40: `trainbox
# plan` does the arithmetic). It prints the pod's id, how to follow the run and how to stop it. Running the same
# command again resumes the run from the Hub. RUNPOD_API_URL points it at another API (a test's stand-in).
set -euo pipefail

usage() {
  echo "usage: $0 DATASET_REPO OUTPUT_REPO [--gpu GPU_TYPE_ID] [--count N] [--price-max DOLLARS_PER_HOUR]" \
    "[--disk GB] [--cloud SECURE|COMMUNITY]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
DATASET_REPO=$1
OUTPUT_REPO=$2
shift 2
GPU="NVIDIA GeForce RTX 4090"
COUNT=1
PRICE_MAX=
DISK=100
CLOUD=SECURE
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) GPU=${2:?--gpu needs a GPU type id} ;;
    --count) COUNT=${2:?--count needs a number} ;;
    --price-max) PRICE_MAX=${2:?--price-max needs dollars per hour} ;;
    --disk) DISK=${2:?--disk needs GB} ;;
    --cloud) CLOUD=${2:?--cloud needs SECURE or COMMUNITY} ;;
    *) usage ;;
  esac
  shift 2
done
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || { echo "runpod.sh: --count $COUNT: give a whole number of GPUs, e.g. --count 1" >&2; exit 2; }
[[ $DISK =~ ^[1-9][0-9]*$ ]] && [ "$DISK" -ge 10 ] || { echo "runpod.sh: --disk $DISK: give GB, 10 or more, e.g. --disk 100" >&2; exit 2; }
[[ -z $PRICE_MAX || $PRICE_MAX =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "runpod.sh: --price-max $PRICE_MAX: give dollars per hour, e.g. --price-max 3.5" >&2; exit 2; }
[[ $CLOUD =~ ^(SECURE|COMMUNITY)$ ]] || { echo "runpod.sh: --cloud $CLOUD: give SECURE or COMMUNITY" >&2; exit 2; }
if [ -z "${RUNPOD_API_KEY:-}" ]; then
  echo "runpod.sh: set RUNPOD_API_KEY to a RunPod API key that may create pods (console > Settings > API Keys)" >&2
  exit 2
fi
API=${RUNPOD_API_URL:-https://api.runpod.io}
IMAGE=${IMAGE:-ghcr.io/libreyolo/trainbox:0.2.0} # a fixed release: a rerun resumes with the same image
RUN_ARGS=${RUN_ARGS:-model=LibreYOLO9s.pt epochs=100 imgsz=640}
MAX_RUNTIME=${MAX_RUNTIME:-12h}
SECRET=${HF_TOKEN_SECRET:-HF_TOKEN} # the name of the RunPod secret holding the Hugging Face token
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One API call: the key goes to curl on its standard input (never on a command line), the answer to stdout.
api() {
  local method=$1 path=$2 body=${3:-} status
  local args=(--silent --show-error --max-time 60 --request "$method" --output "$scratch/answer" --write-out '%{http_code}')
  if [ -n "$body" ]; then args+=(--header "Content-Type: application/json" --data-binary "@$body"); fi
  if ! status=$(printf 'header = "Authorization: Bearer %s"\n' "$RUNPOD_API_KEY" | curl --config - "${args[@]}" "$API$path"); then
    echo "runpod.sh: cannot reach $API: check the network, or RUNPOD_API_URL" >&2
    exit 3
  fi
  if [ "${status:0:1}" != 2 ]; then
    echo "runpod.sh: $method $path: HTTP $status: $(python3 - "$scratch/answer" <<'PY'
import json, sys
try:
    problem = json.load(open(sys.argv[1]))
    print(problem.get("detail") or problem.get("title"), *problem.get("errors") or [], sep="; ")
except Exception:
    print("no details")
PY
)" >&2
    exit 3
  fi
  cat "$scratch/answer"
}

gpu_id=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$GPU")
api GET "/v2/catalog/gpus/$gpu_id" >"$scratch/gpu.json" # a call's failure ends the script here (not in a pipe)
price=$(python3 -c '
import json, sys
gpu, cloud, count = json.load(sys.stdin), sys.argv[1].lower(), int(sys.argv[2])
each = (gpu.get("price") or {}).get(cloud)
print(f"{each * count:.2f}" if isinstance(each, (int, float)) and gpu.get(cloud, True) else "")' "$CLOUD" "$COUNT" <"$scratch/gpu.json")
if [ -z "$price" ]; then
  echo "runpod.sh: $GPU is not offered on RunPod's $CLOUD cloud: pick another --gpu or --cloud" >&2
  exit 3
fi
if [ -n "$PRICE_MAX" ] && python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$price" "$PRICE_MAX"; then
  echo "runpod.sh: $COUNT x $GPU costs \$$price/h on the $CLOUD cloud, above --price-max $PRICE_MAX: raise it or pick another --gpu" >&2
  exit 3
fi

export DATASET_REPO OUTPUT_REPO RUN_ARGS MAX_RUNTIME IMAGE GPU COUNT DISK CLOUD SECRET price
python3 - >"$scratch/pod.json" <<'PY'
import json, os
e = os.environ
print(json.dumps({
    "name": "trainbox-" + e["OUTPUT_REPO"].split("/")[-1],
    "image": e["IMAGE"],
    "cloud": e["CLOUD"],
    "gpu": {"id": e["GPU"], "count": int(e["COUNT"]), "minCudaVersion": "12.6"},
    "disk": 30,
    "mounts": {"persistent": {"size": int(e["DISK"]), "path": "/workspace"}},
    "env": {
        "HF_TOKEN": "{{ RUNPOD_SECRET_%s }}" % e["SECRET"],  # the secret's name, resolved by RunPod in the pod
        "DATASET_REPO": e["DATASET_REPO"],
        "OUTPUT_REPO": e["OUTPUT_REPO"],
        "RUN_ARGS": e["RUN_ARGS"],
        "GPUS": "all",
        "MAX_RUNTIME": e["MAX_RUNTIME"],
        "PRICE_PER_HOUR": e["price"],
        "ON_EXIT": "destroy",
        "ON_FAILURE": "destroy",
    },
}))
PY
api POST /v2/pods "$scratch/pod.json" >"$scratch/made.json"
pod=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])' <"$scratch/made.json")

cat <<TEXT
pod $pod created: $COUNT x $GPU on RunPod's $CLOUD cloud, \$$price/h; it deletes itself when the run ends
follow: trainbox status --repo $OUTPUT_REPO --watch
stop:   curl -X DELETE $API/v2/pods/$pod -H "Authorization: Bearer \$RUNPOD_API_KEY"
        (the agent gets SIGTERM and uploads what it has; the same command resumes the run later)
TEXT
