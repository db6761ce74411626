#!/usr/bin/env bash
# Prepare a fresh Debian machine (as root) for the whole test suite: the system
# packages the sandboxes need, a running Docker engine and the locally built
# test images (no registry is reachable here, so nothing is pulled).
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh must run as root (it installs packages and starts dockerd)" >&2
  exit 1
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  ripgrep bubblewrap docker.io debootstrap iproute2 ca-certificates python3 python3-venv >/dev/null

# An ordinary user: `nox -s unprivileged` runs the README's quick start and the
# conformance suite as it, with no promise relaxed.
id -u vesselci >/dev/null 2>&1 || useradd --create-home --shell /bin/bash vesselci
# In the docker group, as an ordinary user who runs Docker is: the snapshot and fork
# conformance tests run on Docker as it too.
usermod -aG docker vesselci

bash .ci/docker-up.sh
bash .ci/build-images.sh
