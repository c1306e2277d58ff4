#!/usr/bin/env bash
# Make a Docker engine available to tests/container. Idempotent, and never fails its caller:
# where no engine can run, the container tests skip and say why.
#   - installs Debian's engine (docker.io), compose v1 (docker-compose) and debootstrap (for the
#     stand-in base image) when they are missing;
#   - starts dockerd in the background when `docker info` fails, and waits for it;
#   - adds a `docker compose` CLI plugin that runs compose v1 (no compose v2 package exists in
#     Debian bookworm or on PyPI), so tests and users type the same `docker compose ...`.
set -u

log() { echo "docker.sh: $*" >&2; }
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/trainbox-dockerd.log}

install_missing() {
  local need=()
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    log "not root: cannot install ${need[*]}"
    return 1
  fi
  log "installing ${need[*]}"
  apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

start_engine() {
  docker info >/dev/null 2>&1 && return 0
  if ! command -v dockerd >/dev/null 2>&1; then
    log "no dockerd to start"
    return 1
  fi
  log "starting dockerd (log: $DOCKERD_LOG)"
  # Detached from this shell's stdin/stdout, so a caller reading our output is not held open.
  setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  log "dockerd did not answer within 60 s; last lines of its log:"
  tail -n 5 "$DOCKERD_LOG" >&2
  return 1
}

install_compose_plugin() {
  docker compose version >/dev/null 2>&1 && return 0
  command -v docker-compose >/dev/null 2>&1 || return 1
  local version
  version=$(docker-compose version --short 2>/dev/null || echo 1)
  mkdir -p "$PLUGIN_DIR"
  cat >"$PLUGIN_DIR/docker-compose" <<SHIM
#!/bin/sh
# \`docker compose ...\` runs Debian's compose v1 (written by trainbox's .ci/docker.sh).
if [ "\$1" = docker-cli-plugin-metadata ]; then
  echo '{"SchemaVersion":"0.1.0","Vendor":"Debian","Version":"$version","ShortDescription":"Docker Compose v1"}'
  exit 0
fi
shift
exec docker-compose "\$@"
SHIM
  chmod 755 "$PLUGIN_DIR/docker-compose"
  docker compose version >/dev/null 2>&1
}

install_missing || log "could not install the engine packages"
if start_engine; then
  install_compose_plugin || log "no \`docker compose\`: the compose tests will skip"
  log "engine ready: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"
else
  log "no Docker engine: the container tests will skip"
fi
exit 0
