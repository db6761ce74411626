#!/usr/bin/env bash
# Make a Docker engine available for the tests: install Debian's docker.io if
# it is missing, start dockerd in the background (log in $DOCKERD_LOG), and
# wait until `docker info` answers. Idempotent: does nothing if an engine
# already answers. Fails loudly, with the daemon's log, if it cannot start.
set -euo pipefail

log="${DOCKERD_LOG:-/var/log/astralvessel-dockerd.log}"
wait_seconds="${DOCKERD_WAIT:-60}"

engine_answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
    echo "docker-up: engine already running ($(docker version --format '{{.Server.Version}}'))"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    echo "docker-up: installing docker.io from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi

mkdir -p "$(dirname "$log")"

# start_dockerd EXTRA_ARGS...: start the daemon and wait for it; on failure
# stop the daemon this script started (by its pid) and return 1.
start_dockerd() {
    echo "docker-up: starting dockerd $* (log: $log)"
    nohup dockerd "$@" >>"$log" 2>&1 </dev/null &
    local pid=$!
    for _ in $(seq 1 "$wait_seconds"); do
        if engine_answers; then
            echo "docker-up: engine ready (pid $pid)"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "docker-up: dockerd exited early" >&2
            return 1
        fi
        sleep 1
    done
    echo "docker-up: dockerd did not answer within ${wait_seconds}s" >&2
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
}

# Sandboxes run with --network none, so a daemon without its bridge and
# iptables rules is enough; fall back to that where netfilter is unusable.
if start_dockerd || start_dockerd --iptables=false --bridge=none; then
    docker info --format 'docker-up: storage {{.Driver}}, cgroup v{{.CgroupVersion}}, security {{.SecurityOptions}}'
    exit 0
fi

echo "docker-up: FAILED to start a Docker engine; last lines of $log:" >&2
tail -n 40 "$log" >&2 || true
exit 1
