"""Trainbox on Beam: the published image as a headless function with a GPU, a volume and an explicit timeout.

    beam secret create HF_TOKEN hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    python templates/beam_train.py your-org/your-dataset your-org/your-model
    python templates/beam_train.py your-org/your-dataset your-org/your-model --gpu RTX4090 --timeout-hours 12

The function is headless: Ctrl-C, a closed terminal or a sleeping laptop leave it running on Beam (Beam's default,
``headless=False``, would terminate it). This terminal shows its logs while it is open; afterwards follow the run in
Beam's dashboard or with ``beam task list --filter status=running``, and stop it with ``beam task stop TASK_ID``
(the agent gets SIGTERM and uploads what it has). Running the same command again resumes from the Hub.

The container stops when the function returns, so the run's end is the bill's end (ON_EXIT stays `exit`).
``timeout`` bounds a hung run; MAX_RUNTIME is a little shorter, so the agent wraps up itself (final upload,
trainbox.json) before Beam stops it. Beam uploads the folder it runs from as the function's code: the script moves
to its own folder, where `.beamignore` lets beam_train.py alone go (not the repository, a dataset, or a `.env`).
This script exits with the agent's exit code (docs/exit-codes.md), and with 1 when the run failed on Beam (Beam's
message is printed) or this terminal stopped following it.
"""

import argparse
import os
import sys
from collections.abc import Callable

from beam import Image, Volume, function

IMAGE = "ghcr.io/libreyolo/trainbox:0.2.0"  # a fixed release, not `latest`: every attempt runs the same image
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"
GPU = "A10G"
TIMEOUT_HOURS = 6.0
WRAP_UP_S = 15 * 60  # MAX_RUNTIME is the timeout less this: the final upload and trainbox.json fit in it
CPU = 8  # DataLoader workers; Beam's default is 0.125 cores
MEMORY_GIB = 32  # Beam's default is 128 MiB
# $/h on Beam, billed by the second (estimate: a copy of https://www.beam.cloud/pricing of 2026-06-20, not checked
# against the page): the GPU, plus CPU and memory, which Beam bills apart (about $0.19 per core, $0.02 per GiB).
GPU_PRICE = {"RTX4090": 0.69, "A10G": 1.05}
CORE_PRICE = 0.19
GIB_PRICE = 0.02
# How long the agent may wrap up after Beam stops the container (Beam documents no grace period; keep it short).
GRACE_S = 25


def options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="beam_train.py", description="Train a LibreYOLO model on Beam.")
    parser.add_argument("dataset_repo")
    parser.add_argument("output_repo")
    parser.add_argument("--run-args", default=RUN_ARGS, help=f"libreyolo's options (default: {RUN_ARGS})")
    parser.add_argument("--gpu", default=GPU, help=f"Beam's GPU name (default: {GPU})")
    parser.add_argument("--timeout-hours", type=float, default=TIMEOUT_HOURS, help="Beam's limit on the run")
    parser.add_argument("--max-runtime", help="the agent's own limit (default: the timeout less 15 minutes)")
    parser.add_argument("--price-per-hour", type=float, help="$/h of the whole container (default: Beam's list price)")
    args = parser.parse_args(argv)
    if args.timeout_hours * 3600 <= WRAP_UP_S:
        parser.error(f"--timeout-hours must leave {WRAP_UP_S // 60} minutes for the final upload")
    if args.max_runtime is None:
        args.max_runtime = f"{int(args.timeout_hours * 3600 - WRAP_UP_S) // 60}m"
    if args.price_per_hour is None:
        if args.gpu not in GPU_PRICE:
            parser.error(f"no price known for --gpu {args.gpu}: give --price-per-hour (https://www.beam.cloud/pricing)")
        args.price_per_hour = round(GPU_PRICE[args.gpu] + CPU * CORE_PRICE + MEMORY_GIB * GIB_PRICE, 2)
    return args


# The resources come from the command line when this file is run. Beam's container imports it as a module to find
# `train`, and there the defaults stand: they only matter where the function is created, here.
ARGS = options(sys.argv[1:]) if __name__ == "__main__" else None


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
    gpu=ARGS.gpu if ARGS else GPU,
    cpu=CPU,
    memory=f"{MEMORY_GIB}Gi",
    timeout=int((ARGS.timeout_hours if ARGS else TIMEOUT_HOURS) * 3600),
    # Beam retries a crashed container 3 times by default, each attempt billed from the start: a failed run is
    # not retried here, its exit code names the fix. Run the script again to resume from the Hub.
    retries=0,
    # The run goes on when this client goes away (Ctrl-C, a closed laptop): a training must not die with a terminal.
    headless=True,
    volumes=[Volume(name="trainbox-workspace", mount_path="/workspace")],
    secrets=["HF_TOKEN"],
)
def train(dataset_repo: str, output_repo: str, run_args: str, max_runtime: str, price_per_hour: float) -> int:
    import os

    env = {
        **os.environ,
        "DATASET_REPO": dataset_repo,
        "OUTPUT_REPO": output_repo,
        "RUN_ARGS": run_args,
        "WORKDIR": "/workspace",
        "MAX_RUNTIME": max_runtime,
        "PRICE_PER_HOUR": f"{price_per_hour:g}",
        "ON_EXIT": "exit",
    }
    return run_agent(["trainbox", "run"], env, GRACE_S)


def exit_code(call: Callable[[], object]) -> int:
    """The process exit code for ``call`` (of ``train.remote``): the agent's code, else 1 with the reason."""
    try:
        result = call()
    except Exception as error:  # newer SDKs raise (RemoteExecutionError) where older ones return None
        print(f"beam_train: the run failed on Beam: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if isinstance(result, int) and not isinstance(result, bool):
        if result in (80, 143):  # MAX_RUNTIME reached, or stopped: every finished epoch is on the Hub
            print("beam_train: the run stopped early; run the same command again to resume it", file=sys.stderr)
        return result
    print(
        "beam_train: Beam returned no result: the run failed or timed out, or this terminal stopped following it"
        " (a headless run goes on: `beam task list --filter status=running`)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    assert ARGS is not None
    # Beam syncs the working folder, filtered by the .beamignore found there: this file's folder has one.
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    print(f"beam_train: {ARGS.gpu}, up to {ARGS.timeout_hours:g} h, ${ARGS.price_per_hour:g}/h", flush=True)
    sys.exit(
        exit_code(
            lambda: train.remote(
                ARGS.dataset_repo, ARGS.output_repo, ARGS.run_args, ARGS.max_runtime, ARGS.price_per_hour
            )
        )
    )
