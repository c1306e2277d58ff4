"""Trainbox on Modal: the published image as a function with a GPU, a volume and an explicit timeout.

    modal secret create huggingface HF_TOKEN=hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    modal run --detach templates/modal_train.py --dataset-repo your-org/your-dataset --output-repo your-org/your-model

``--detach`` keeps the run going when this terminal closes or the laptop sleeps; without it, losing the local
client stops the app. Follow a detached run with ``modal app logs -f trainbox`` (without ``-f`` it prints the last
lines and exits); the model is on the Hub either way.

The container scales to zero when the function returns, so the run's end is the bill's end (ON_EXIT stays
`exit`). ``timeout`` is the only barrier between a hung run and a bill until Modal's 24 h maximum; MAX_RUNTIME
is set a little shorter, so the agent wraps up itself (final upload, trainbox.json) before Modal kills it.

Preemption: Modal interrupts the function (SIGINT) and restarts it on the same input. The agent gets SIGTERM,
uploads what it has and writes trainbox.json within Modal's 30 s grace; the restart resumes from the Hub.
"""

import modal

IMAGE = "ghcr.io/libreyolo/trainbox:0.1.0"  # a fixed release: a restart runs the same image as the first attempt
GPU = "A100"
CPU = 8.0  # DataLoader workers; Modal's default is a fraction of one core
MEMORY_MB = 32768
TIMEOUT_S = 6 * 60 * 60
MAX_RUNTIME = "5h45m"  # TIMEOUT_S less the time the final upload needs
# Modal gives an interrupted container 30 s; the agent's wrap-up must end inside it, the volume commit after.
GRACE_S = 25
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"

app = modal.App("trainbox")
# Modal runs the function through its own Python entrypoint: clear the image's `tini -- trainbox`.
image = modal.Image.from_registry(IMAGE).entrypoint([])
workspace = modal.Volume.from_name("trainbox-workspace", create_if_missing=True)


def run_agent(argv: list[str], env: dict[str, str], grace_s: float) -> int:
    """Run the agent; on the platform's interrupt (SIGINT or SIGTERM) send it SIGTERM and wait up to ``grace_s``.

    Not ``subprocess.run``: on an interrupt it kills the child 0.25 s later, before the final upload.
    """
    import contextlib
    import signal
    import subprocess
    import time

    agent = subprocess.Popen(argv, env=env)
    deadline: list[float] = []

    def forward(*_: object) -> None:
        if not deadline:
            agent.send_signal(signal.SIGTERM)
            deadline.append(time.monotonic() + grace_s)

    previous: dict[int, object] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: the interrupt comes as KeyboardInterrupt
            previous[signum] = signal.signal(signum, forward)
    try:
        while True:
            try:
                return agent.wait(timeout=1)
            except KeyboardInterrupt:
                forward()
            except subprocess.TimeoutExpired:
                if deadline and time.monotonic() > deadline[0]:
                    agent.kill()
                    return agent.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@app.function(
    image=image,
    gpu=GPU,
    cpu=CPU,
    memory=MEMORY_MB,
    timeout=TIMEOUT_S,
    # A failed run is not retried: its exit code names the fix (README's table). Preemption restarts happen
    # regardless, and resume from the Hub.
    retries=0,
    volumes={"/workspace": workspace},
    secrets=[modal.Secret.from_name("huggingface")],  # provides HF_TOKEN
)
def train(dataset_repo: str, output_repo: str, run_args: str = RUN_ARGS) -> int:
    import os

    env = {
        **os.environ,
        "DATASET_REPO": dataset_repo,
        "OUTPUT_REPO": output_repo,
        "RUN_ARGS": run_args,
        "WORKDIR": "/workspace",
        "MAX_RUNTIME": MAX_RUNTIME,
        "ON_EXIT": "exit",
    }
    code = run_agent(["trainbox", "run"], env, GRACE_S)
    workspace.commit()  # keep the run folder for a later resume; the checkpoints are on the Hub already
    return code


@app.local_entrypoint()
def main(dataset_repo: str, output_repo: str, run_args: str = RUN_ARGS) -> None:
    code = train.remote(dataset_repo, output_repo, run_args)
    if code != 0:  # the agent's exit code (README's table): `modal run` exits with it
        raise SystemExit(code if isinstance(code, int) else 1)
