# Trainbox: the training agent on an official PyTorch CUDA runtime image.
#
#   docker build -t trainbox .                                   # CUDA 12.6: NVIDIA driver >= 560 (>= 525
#                                                                # through CUDA minor-version compatibility)
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime -t trainbox:cu130 .
#                                                                # CUDA 13.0: driver >= 580; Blackwell GPUs need it
#   docker build --build-arg LIBREYOLO_EXTRAS=rfdetr,lora -t trainbox:rfdetr-lora .
#   docker build --build-arg TRAINBOX_UID=1000 -t trainbox:nonroot .  # the agent runs as uid 1000, not root
#   docker build --build-arg TRAINBOX_RUNTIMES=parquet,onnx -t trainbox:offline .  # pyarrow, onnx, onnxruntime
#                                                                # inside: nothing fetched on first use
#
# Builds with BuildKit and with the legacy builder alike: no `# syntax=` line, no heredocs, no RUN --mount.
# The base's torch and torchvision are kept as they are: pip is constrained to them, and the build fails if
# they changed anyway (a CPU wheel or another CUDA build swapped in would only fail on the GPU, at run time).

ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TINI_SUBREAPER=1 \
    MONITOR_HOST=0.0.0.0

# tini: PID 1 that forwards SIGTERM (preemption) to the agent and reaps the training's children. No GUI
# libraries (libGL/Mesa, GLib): OpenCV is the headless build (see below).
# Versions come from the base's distribution release; pinning them would break every other base.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# The base's torch/torchvision (and OpenCV, below), as pip constraints: every later pip install (ours, and a
# user's in a derived image or a shell) fails with ResolutionImpossible instead of replacing them.
RUN mkdir -p /etc/trainbox \
 && python3 -m pip list --format=freeze | grep -iE '^(torch|torchvision)==' | sort > /etc/trainbox/constraints.txt \
 && if [ "$(wc -l < /etc/trainbox/constraints.txt)" != 2 ]; then \
      echo "BASE_IMAGE must carry torch and torchvision (a pytorch/pytorch runtime image)" >&2; exit 1; \
    fi
ENV PIP_CONSTRAINT=/etc/trainbox/constraints.txt

# OpenCV without its GUI: libreyolo requires `opencv-python` (Qt, video codecs, and libGL from the system: about
# 400 MB here), but training, validation and export only use what `opencv-python-headless` has too. pip cannot
# swap one requirement for another, and a constraint can only pin, not exclude: so the headless build goes in
# first, then a metadata-only `opencv-python` wheel (docker/opencv_python_standin.py) that installs no files and
# requires the headless build of the same version. Both are pinned in the constraints file, the stand-in at a
# `+headless` version no index has: a later `pip install libreyolo[...]` finds `opencv-python` satisfied, and
# nothing (not even --upgrade) can fetch the GUI build back.
# Unpinned like libreyolo's own dependencies in the next step: the newest build that fits them.
COPY docker/opencv_python_standin.py /opt/trainbox/docker/
# hadolint ignore=DL3013
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install opencv-python-headless \
 && python3 /opt/trainbox/docker/opencv_python_standin.py /tmp/standin > /tmp/standin.txt \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install "$(head -n 1 /tmp/standin.txt)" \
 && tail -n +2 /tmp/standin.txt >> /etc/trainbox/constraints.txt \
 && rm -rf /tmp/standin /tmp/standin.txt

# Dependencies before the code, so a code change rebuilds one small layer. Only pyproject.toml is needed here:
# its build requirements and dependencies, plus libreyolo's extras for this variant. `pip check` reports
# conflicts without failing: a base's own packages may already disagree with one another (the container tests
# require it clean on the stand-in base).
# TRAINBOX_RUNTIMES (parquet, onnx, trackio, comma separated) bakes in what the agent otherwise fetches on first use into
# the volume (entrypoint/runtimes/fetch.py): for hosts that cannot reach PyPI. The pins are pyproject.toml's extras.
COPY pyproject.toml /opt/trainbox/
ARG LIBREYOLO_EXTRAS=""
ARG TRAINBOX_RUNTIMES=""
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("/opt/trainbox/pyproject.toml", "rb")); extras = p["project"]["optional-dependencies"]; names = [n.strip() for n in sys.argv[1].split(",") if n.strip()]; bad = [n for n in names if n not in ("parquet", "onnx", "trackio")]; sys.exit(f"TRAINBOX_RUNTIMES: unknown {bad}: use parquet, onnx, trackio") if bad else print("\n".join(p["build-system"]["requires"] + p["project"]["dependencies"] + [r for n in names for r in extras[n]]))' "$TRAINBOX_RUNTIMES" > /opt/trainbox/requirements.txt \
 && if [ -n "$LIBREYOLO_EXTRAS" ]; then echo "libreyolo[$LIBREYOLO_EXTRAS]" >> /opt/trainbox/requirements.txt; fi \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -r /opt/trainbox/requirements.txt \
 && python3 -m pip list --format=freeze | grep -iE '^(torch|torchvision)==' | sort > /tmp/torch.txt \
 && if ! grep -iE '^(torch|torchvision)==' /etc/trainbox/constraints.txt | cmp -s - /tmp/torch.txt; then \
      echo "pip replaced the base image's torch/torchvision" >&2; exit 1; \
    fi \
 && rm /tmp/torch.txt \
 && { python3 -m pip check || true; }

COPY README.md /opt/trainbox/
COPY entrypoint /opt/trainbox/entrypoint
# pip refuses a base whose Python is outside the project's requires-python. Smoke test: the agent, torch,
# torchvision's compiled ops, OpenCV (without libGL) and libreyolo import, and the console script is on PATH.
# libreyolo's train options are read once here (starting libreyolo to ask costs seconds on every start).
ENV TRAINBOX_CACHE_DIR=/opt/trainbox/cache
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps --no-build-isolation /opt/trainbox \
 && python3 -c "import cv2, torch, torchvision.ops, entrypoint.cli; from libreyolo import LibreYOLO; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'OpenCV', cv2.__version__)" \
 && python3 -c "import os, pathlib; from entrypoint import libreyolo; print(len(libreyolo.train_options(pathlib.Path(os.environ['TRAINBOX_CACHE_DIR']))), 'libreyolo train options')" \
 && mkdir -p "$TRAINBOX_CACHE_DIR" && chmod -R a+rX "$TRAINBOX_CACHE_DIR" \
 && trainbox --version

# The persistent volume: data, runs, the Hugging Face cache and downloaded weights all live under it.
WORKDIR /workspace

# Optional non-root user: --build-arg TRAINBOX_UID=1000 runs the agent as uid and gid 1000, home /workspace,
# which it owns (a new Docker volume takes that owner; on Kubernetes set fsGroup, see templates/kubernetes.yaml).
# Unset, the default, it runs as root, as the GPU clouds' images do. The user is written into /etc/passwd and
# /etc/group directly: no useradd needed in the base.
ARG TRAINBOX_UID=""
RUN if [ -n "$TRAINBOX_UID" ]; then \
      case "$TRAINBOX_UID" in *[!0-9]*|0) echo "TRAINBOX_UID must be a number above 0" >&2; exit 1 ;; esac; \
      echo "trainbox:x:${TRAINBOX_UID}:" >> /etc/group \
      && echo "trainbox:x:${TRAINBOX_UID}:${TRAINBOX_UID}:trainbox:/workspace:/usr/sbin/nologin" >> /etc/passwd \
      && chown "${TRAINBOX_UID}:${TRAINBOX_UID}" /workspace; \
    fi
# Numeric after substitution (root's 0:0 by default), so the host resolves it without a passwd entry.
# hadolint ignore=DL3066
USER ${TRAINBOX_UID:-0}:${TRAINBOX_UID:-0}
# `libreyolo monitor` (MONITOR=1); it listens on all of the container's interfaces (MONITOR_HOST above), so
# publish it to the host's loopback only: -p 127.0.0.1:8420:8420.
EXPOSE 8420

# Unhealthy once the agent's own state (trainbox.json) says the run failed, stalled or timed out.
HEALTHCHECK --interval=1m --timeout=30s --start-period=5m --retries=2 \
  CMD ["python3", "-c", "import json, subprocess, sys; s = subprocess.run(['trainbox', 'status', '--json'], capture_output=True); sys.exit(s.returncode or json.loads(s.stdout)['phase'] in ('failed', 'stalled', 'timed_out'))"]

ENTRYPOINT ["tini", "--", "trainbox"]
CMD ["run"]

# Last, so that new values (every commit) do not invalidate the layers above.
ARG BASE_IMAGE
ARG TRAINBOX_RUNTIMES
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/libreyolo/trainbox
LABEL org.opencontainers.image.title="trainbox" \
      org.opencontainers.image.description="Turns a rented GPU into a finished LibreYOLO model, then stops the bill." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      trainbox.libreyolo-extras="${LIBREYOLO_EXTRAS}" \
      trainbox.runtimes="${TRAINBOX_RUNTIMES}"
