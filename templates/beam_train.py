"""Trainbox on Beam: the published image as a function with a GPU, a volume and an explicit timeout.

    beam secret create HF_TOKEN hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    python templates/beam_train.py your-org/your-dataset your-org/your-model

The container stops when the function returns, so the run's end is the bill's end (ON_EXIT stays `exit`).
``timeout`` bounds a hung run; MAX_RUNTIME is set a little shorter, so the agent wraps up itself (final
upload, trainbox.json) before Beam stops it. Ctrl-C here leaves the function running on Beam (the SDK says so);
follow it in the dashboard. Beam uploads the folder it runs from as the function's code: the script moves to
its own folder, where `.beamignore` lets beam_train.py alone go (not the repository, a dataset, or a `.env`).
This script exits with the agent's exit code (README's table), and with 1 when Beam
reports no result (the function failed, or was left running by Ctrl-C).
"""

import os
import sys

from beam import Image, Volume, function

IMAGE = "ghcr.io/libreyolo/trainbox:0.1.0"  # a fixed release, not `latest`: every attempt runs the same image
GPU = "A100-40"
TIMEOUT_S = 6 * 60 * 60
MAX_RUNTIME = "5h45m"  # TIMEOUT_S less the time the final upload needs
# How long the agent may wrap up after Beam stops the container (Beam documents no grace period; keep it short).
GRACE_S = 25
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"


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


@function(
    image=Image(base_image=IMAGE),
    gpu=GPU,
    cpu=8,  # DataLoader workers; Beam's default is one core
    memory="32Gi",  # Beam's default is 128 MiB
    timeout=TIMEOUT_S,
    # Beam retries a crashed container 3 times by default, each attempt billed from the start: a failed run is
    # not retried here, its exit code names the fix. Run the script again to resume from the Hub.
    retries=0,
    volumes=[Volume(name="trainbox-workspace", mount_path="/workspace")],
    secrets=["HF_TOKEN"],
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
    return run_agent(["trainbox", "run"], env, GRACE_S)


def exit_code(result: object) -> int:
    """The process exit code for what `.remote()` returned: Beam returns None when the function failed."""
    if isinstance(result, int):
        return result
    print("beam_train: Beam returned no result: the run failed or is still running remotely", file=sys.stderr)
    return 1


if __name__ == "__main__":
    dataset, output, *rest = sys.argv[1:]
    # Beam syncs the working folder, filtered by the .beamignore found there: this file's folder has one.
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    sys.exit(exit_code(train.remote(dataset, output, *rest)))
