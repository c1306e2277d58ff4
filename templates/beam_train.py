"""Trainbox on Beam: the published image as a function with a GPU, a volume and an explicit timeout.

    beam secret create HF_TOKEN hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    python templates/beam_train.py your-org/your-dataset your-org/your-model

The container stops when the function returns, so the run's end is the bill's end (ON_EXIT stays `exit`).
``timeout`` bounds a hung run; MAX_RUNTIME is set a little shorter, so the agent wraps up itself (final
upload, trainbox.json) before Beam stops it.
"""

import sys

from beam import Image, Volume, function

IMAGE = "ghcr.io/libreyolo/trainbox:latest"
GPU = "A100-40"
TIMEOUT_S = 6 * 60 * 60
MAX_RUNTIME = "5h45m"  # TIMEOUT_S less the time the final upload needs
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"


@function(
    image=Image(base_image=IMAGE),
    gpu=GPU,
    cpu=8,
    memory="32Gi",
    timeout=TIMEOUT_S,
    volumes=[Volume(name="trainbox-workspace", mount_path="/workspace")],
    secrets=["HF_TOKEN"],
)
def train(dataset_repo: str, output_repo: str, run_args: str = RUN_ARGS) -> int:
    import os
    import subprocess

    env = {
        **os.environ,
        "DATASET_REPO": dataset_repo,
        "OUTPUT_REPO": output_repo,
        "RUN_ARGS": run_args,
        "WORKDIR": "/workspace",
        "MAX_RUNTIME": MAX_RUNTIME,
        "ON_EXIT": "exit",
    }
    return subprocess.run(["trainbox", "run"], env=env, check=False).returncode


if __name__ == "__main__":
    dataset, output, *rest = sys.argv[1:]
    sys.exit(train.remote(dataset, output, *rest))
