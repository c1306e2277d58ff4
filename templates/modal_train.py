"""Trainbox on Modal: the published image as a function with a GPU, a volume and an explicit timeout.

    modal secret create huggingface HF_TOKEN=hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    modal run templates/modal_train.py --dataset-repo your-org/your-dataset --output-repo your-org/your-model

The container scales to zero when the function returns, so the run's end is the bill's end (ON_EXIT stays
`exit`). ``timeout`` is the only barrier between a hung run and a bill until Modal's 24 h maximum; MAX_RUNTIME
is set a little shorter, so the agent wraps up itself (final upload, trainbox.json) before Modal kills it.
"""

import modal

IMAGE = "ghcr.io/libreyolo/trainbox:latest"
GPU = "A100"
TIMEOUT_S = 6 * 60 * 60
MAX_RUNTIME = "5h45m"  # TIMEOUT_S less the time the final upload needs
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"

app = modal.App("trainbox")
# Modal runs the function through its own Python entrypoint: clear the image's `tini -- trainbox`.
image = modal.Image.from_registry(IMAGE).entrypoint([])
workspace = modal.Volume.from_name("trainbox-workspace", create_if_missing=True)


@app.function(
    image=image,
    gpu=GPU,
    timeout=TIMEOUT_S,
    volumes={"/workspace": workspace},
    secrets=[modal.Secret.from_name("huggingface")],  # provides HF_TOKEN
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
    code = subprocess.run(["trainbox", "run"], env=env, check=False).returncode
    workspace.commit()  # keep the run folder for a later resume; the checkpoints are on the Hub already
    return code


@app.local_entrypoint()
def main(dataset_repo: str, output_repo: str, run_args: str = RUN_ARGS) -> None:
    code = train.remote(dataset_repo, output_repo, run_args)
    if code:
        raise SystemExit(code)
