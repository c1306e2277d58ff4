"""Trainbox on Modal: the published image as a function with a GPU, a volume and an explicit timeout.

    modal secret create huggingface HF_TOKEN=hf_...        # once: read DATASET_REPO, write OUTPUT_REPO
    modal run --detach templates/modal_train.py --dataset-repo your-org/your-dataset --output-repo your-org/your-model
    modal run --detach templates/modal_train.py ... --gpu H100 --timeout-hours 12 --run-args "model=LibreYOLO9m.pt ..."

``--detach`` keeps the app when this terminal closes or the laptop sleeps, and the run is started with ``.spawn()``:
a spawned call lives on Modal, independent of this client, which only waits for its result (a blocking
``.remote()`` input has been seen cancelled when a detached client's laptop slept). Follow the run with
``modal app logs -f trainbox`` (without ``-f`` it prints the last lines and exits); stop it with
``modal app stop trainbox``. The model is on the Hub either way, and running the same command again resumes the run
from there (after MAX_RUNTIME, exit 80, too).

The container scales to zero when the function returns, so the run's end is the bill's end (ON_EXIT stays
`exit`). ``timeout`` is the only barrier between a hung run and a bill until Modal's 24 h maximum; MAX_RUNTIME
is a little shorter, so the agent wraps up itself (final upload, trainbox.json) before Modal kills it.

Preemption: Modal interrupts the function (SIGINT) and restarts it on the same input. The agent gets SIGTERM,
uploads what it has and writes trainbox.json within Modal's 30 s grace; the restart resumes from the Hub.
"""

import modal

IMAGE = "ghcr.io/libreyolo/trainbox:0.2.0"  # a fixed release: a restart runs the same image as the first attempt
RUN_ARGS = "model=LibreYOLO9s.pt epochs=100 imgsz=640"
GPU = "A100"  # 40 GB; --gpu picks another (Modal's names: T4, L4, A10G, L40S, A100, A100-80GB, H100, ...)
TIMEOUT_HOURS = 6.0
MAX_TIMEOUT_HOURS = 24.0  # Modal's maximum for one attempt
WRAP_UP_S = 15 * 60  # MAX_RUNTIME is the timeout less this: the final upload and trainbox.json fit in it
CPU = 8.0  # physical cores for the DataLoader workers; Modal's default is a fraction of one core
MEMORY_MB = 32768
# $/h on Modal, billed by the second: the GPU (https://modal.com/pricing, per-second rates as copied on 2026-05-07;
# A10G and A100 from an older copy: estimate), plus CPU and memory, billed apart (about $0.047 per physical core and
# $0.008 per GiB an hour: estimate).
GPU_PRICE = {"T4": 0.59, "L4": 0.80, "A10G": 1.10, "L40S": 1.95, "A100": 2.10, "A100-80GB": 2.50, "H100": 3.95}
CPU_AND_MEMORY_PRICE = round(CPU * 0.047 + MEMORY_MB / 1024 * 0.008, 2)
# Modal gives an interrupted container 30 s; the agent's wrap-up must end inside it, the volume commit after.
GRACE_S = 25

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
    gpu=GPU,  # the defaults; the local entrypoint sets the GPU and the timeout of each run (with_options)
    cpu=CPU,
    memory=MEMORY_MB,
    timeout=int(TIMEOUT_HOURS * 3600),
    # A failed run is not retried: its exit code names the fix (docs/exit-codes.md). Preemption restarts happen
    # regardless, and resume from the Hub.
    retries=0,
    volumes={"/workspace": workspace},
    secrets=[modal.Secret.from_name("huggingface")],  # provides HF_TOKEN
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
    code = run_agent(["trainbox", "run"], env, GRACE_S)
    workspace.commit()  # keep the run folder for a later resume; the checkpoints are on the Hub already
    return code


def launch_settings(gpu: str, timeout_hours: float, max_runtime: str, price_per_hour: str) -> tuple[int, str, float]:
    """(timeout in seconds, MAX_RUNTIME, $/h) of a run; a setting that cannot work stops here, before any bill."""
    if not WRAP_UP_S < timeout_hours * 3600 <= MAX_TIMEOUT_HOURS * 3600:
        raise SystemExit(f"modal_train: --timeout-hours must be over 0.25 and at most {MAX_TIMEOUT_HOURS:g} (Modal's)")
    timeout_s = int(timeout_hours * 3600)
    if price_per_hour:
        price = float(price_per_hour)
    elif gpu in GPU_PRICE:
        price = round(GPU_PRICE[gpu] + CPU_AND_MEMORY_PRICE, 2)
    else:
        raise SystemExit(
            f"modal_train: no price known for --gpu {gpu}: give --price-per-hour (https://modal.com/pricing)"
        )
    return timeout_s, max_runtime or f"{(timeout_s - WRAP_UP_S) // 60}m", price


@app.local_entrypoint()
def main(
    dataset_repo: str,
    output_repo: str,
    run_args: str = RUN_ARGS,
    gpu: str = GPU,
    timeout_hours: float = TIMEOUT_HOURS,
    max_runtime: str = "",
    price_per_hour: str = "",
) -> None:
    timeout_s, runtime, price = launch_settings(gpu, timeout_hours, max_runtime, price_per_hour)
    print(f"modal_train: {gpu}, up to {timeout_s / 3600:g} h (MAX_RUNTIME={runtime}), ${price:g}/h", flush=True)
    # spawn, not remote: the call lives on Modal, independent of this client, which only waits for its result.
    call = train.with_options(gpu=gpu, timeout=timeout_s).spawn(dataset_repo, output_repo, run_args, runtime, price)
    print(f"modal_train: started {call.object_id}; follow it with `modal app logs -f trainbox`", flush=True)
    code = call.get()
    if code in (80, 143):  # MAX_RUNTIME reached, or stopped: every finished epoch is on the Hub
        print("modal_train: the run stopped early; run the same command again to resume it", flush=True)
    if code != 0:  # the agent's exit code (docs/exit-codes.md): `modal run` exits with it
        raise SystemExit(code if isinstance(code, int) else 1)
