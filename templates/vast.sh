#!/usr/bin/env bash
# Trainbox on Vast.ai in one command: rents the cheapest matching offer through Vast.ai's API, runs the published
# image on it, trains, puts every epoch on the Hub, then destroys the instance (ON_EXIT=destroy, with the
# CONTAINER_API_KEY Vast.ai gives every instance), so neither GPU nor disk bills after the run.
#
#   export VAST_API_KEY=...   # once: your Vast.ai API key (console > Account > API Keys)
#   # once: console > Account > Environment Variables: HF_TOKEN, a Hugging Face token that reads the dataset repo and
#   # writes the model repo. Vast.ai gives it to every instance of yours: it is never in the request.
#   templates/vast.sh your-org/your-dataset your-org/your-model
#   RUN_ARGS="model=LibreYOLO9m.pt epochs=300 imgsz=640" templates/vast.sh org/data org/model \
#     --gpu "H100 SXM" --count 2 --price-max 5 --disk 200
#
# --gpu is Vast.ai's GPU name (as its search shows it); --price-max is the most the instance may cost ($/h, all its
# GPUs and the disk); --disk is the instance's disk in GB (2.5x the dataset tar plus 40: `trainbox plan` does the
# arithmetic). Only verified hosts whose driver runs CUDA 12.6 are rented, on-demand (never outbid). It prints the
# instance's id, how to follow the run and how to stop it. VAST_API_URL points it at another API (a test's stand-in).
set -euo pipefail

usage() {
  echo "usage: $0 DATASET_REPO OUTPUT_REPO [--gpu GPU_NAME] [--count N] [--price-max DOLLARS_PER_HOUR] [--disk GB]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
DATASET_REPO=$1
OUTPUT_REPO=$2
shift 2
GPU="RTX 4090"
COUNT=1
PRICE_MAX=
DISK=100
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) GPU=${2:?--gpu needs a GPU name} ;;
    --count) COUNT=${2:?--count needs a number} ;;
    --price-max) PRICE_MAX=${2:?--price-max needs dollars per hour} ;;
    --disk) DISK=${2:?--disk needs GB} ;;
    *) usage ;;
  esac
  shift 2
done
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || { echo "vast.sh: --count $COUNT: give a whole number of GPUs, e.g. --count 1" >&2; exit 2; }
[[ $DISK =~ ^[1-9][0-9]*$ ]] || { echo "vast.sh: --disk $DISK: give GB, e.g. --disk 100" >&2; exit 2; }
[[ -z $PRICE_MAX || $PRICE_MAX =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "vast.sh: --price-max $PRICE_MAX: give dollars per hour, e.g. --price-max 0.8" >&2; exit 2; }
if [ -z "${VAST_API_KEY:-}" ]; then
  echo "vast.sh: set VAST_API_KEY to your Vast.ai API key (console > Account > API Keys)" >&2
  exit 2
fi
API=${VAST_API_URL:-https://console.vast.ai}
IMAGE=${IMAGE:-ghcr.io/libreyolo/trainbox:0.2.0} # a fixed release: a rerun resumes with the same image
RUN_ARGS=${RUN_ARGS:-model=LibreYOLO9s.pt epochs=100 imgsz=640}
MAX_RUNTIME=${MAX_RUNTIME:-12h}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One API call: the key goes to curl on its standard input (never on a command line), the answer to stdout.
api() {
  local method=$1 path=$2 body=$3 status
  if ! status=$(printf 'header = "Authorization: Bearer %s"\n' "$VAST_API_KEY" | curl --config - --silent --show-error \
    --max-time 60 --request "$method" --header "Content-Type: application/json" --data-binary "@$body" \
    --output "$scratch/answer" --write-out '%{http_code}' "$API$path"); then
    echo "vast.sh: cannot reach $API: check the network, or VAST_API_URL" >&2
    exit 3
  fi
  if [ "${status:0:1}" != 2 ]; then
    echo "vast.sh: $method $path: HTTP $status: $(python3 -c '
import json, sys
try:
    said = json.load(open(sys.argv[1]))
    print(said.get("msg") or said.get("error") or "no details")
except Exception:
    print("no details")' "$scratch/answer")" >&2
    exit 3
  fi
  cat "$scratch/answer"
}

export DATASET_REPO OUTPUT_REPO RUN_ARGS MAX_RUNTIME IMAGE GPU COUNT DISK PRICE_MAX
python3 - >"$scratch/search.json" <<'PY'
import json, os
e = os.environ
query = {
    "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}, "rented": {"eq": False},
    "gpu_name": {"eq": e["GPU"]}, "num_gpus": {"eq": int(e["COUNT"])}, "disk_space": {"gte": int(e["DISK"])},
    "cuda_max_good": {"gte": 12.6},
    "order": [["dph_total", "asc"]], "type": "on-demand", "allocated_storage": int(e["DISK"]), "limit": 5,
}
if e["PRICE_MAX"]:
    query["dph_total"] = {"lte": float(e["PRICE_MAX"])}
print(json.dumps(query))
PY
api POST /api/v0/bundles/ "$scratch/search.json" >"$scratch/offers.json" # a failure ends the script here
offer=$(python3 -c '
import json, sys
offers = json.load(sys.stdin).get("offers") or []
if offers:
    print(offers[0]["id"], "%.2f" % offers[0]["dph_total"])' <"$scratch/offers.json")
if [ -z "$offer" ]; then
  echo "vast.sh: no verified on-demand offer of $COUNT x $GPU with ${DISK} GB${PRICE_MAX:+ at \$$PRICE_MAX/h or less}:" \
    "raise --price-max, or pick another --gpu (Vast.ai's names, e.g. \"RTX 4090\", \"H100 SXM\")" >&2
  exit 3
fi
read -r offer_id price <<<"$offer"

python3 - >"$scratch/create.json" <<'PY'
import json, os
e = os.environ
print(json.dumps({
    "client_id": "me",
    "image": e["IMAGE"],
    "label": "trainbox " + e["OUTPUT_REPO"],
    "disk": int(e["DISK"]),
    "runtype": "args",  # the image's own entrypoint, with these arguments
    "args": ["run"],
    "env": {  # HF_TOKEN is not here: the account's environment variables reach every instance
        "DATASET_REPO": e["DATASET_REPO"],
        "OUTPUT_REPO": e["OUTPUT_REPO"],
        "RUN_ARGS": e["RUN_ARGS"],
        "GPUS": "all",
        "MAX_RUNTIME": e["MAX_RUNTIME"],
        "ON_EXIT": "destroy",
        "ON_FAILURE": "destroy",
    },
}))
PY
api PUT "/api/v0/asks/$offer_id/" "$scratch/create.json" >"$scratch/made.json"
instance=$(python3 -c '
import json, sys
made = json.load(sys.stdin)
print(made["new_contract"] if made.get("success") else "")' <"$scratch/made.json")
if [ -z "$instance" ]; then
  echo "vast.sh: Vast.ai did not rent offer $offer_id (taken meanwhile?): run the command again" >&2
  exit 3
fi

cat <<TEXT
instance $instance created: $COUNT x $GPU, \$$price/h; it destroys itself when the run ends
follow: trainbox status --repo $OUTPUT_REPO --watch
stop:   curl -X DELETE $API/api/v0/instances/$instance/ -H "Authorization: Bearer \$VAST_API_KEY"
        (the agent gets SIGTERM and uploads what it has; the same command resumes the run later)
TEXT
