#!/usr/bin/env bash
# Build the Docker images the tests use, offline from any registry: a Debian
# bookworm root filesystem made with debootstrap from the Debian mirror apt
# already uses, imported as an image. The rootfs tarball is cached outside the
# clone (reused between CI runs on one machine); a fresh machine builds it in
# about a minute.
#
#   astralvessel-test/base:bookworm      python3, ripgrep, bash, coreutils
#   astralvessel-test/nopython:bookworm  the same without any Python (the fallback)
#
# Environment: AV_IMAGE_CACHE (default /var/cache/astralvessel, else .ci/cache),
# DEBIAN_MIRROR (default: the first deb.debian.org-style URI apt uses).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite=bookworm
packages="python3,ripgrep,curl,git,python3-pip"
base_image="astralvessel-test/base:$suite"
nopython_image="astralvessel-test/nopython:$suite"
# Bump when the recipe below changes, so caches built by an older recipe are not reused.
recipe=3

cache="${AV_IMAGE_CACHE:-/var/cache/astralvessel}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
    cache="$here/cache"
    mkdir -p "$cache"
fi

mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
    mirror="$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | grep -oE 'https?://[^ ]+' | head -n1 || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
fi

key="$(printf '%s\n' "$suite" "$packages" "$recipe" | sha256sum | cut -c1-16)"
tarball="$cache/rootfs-$suite-$key.tar"

command -v docker >/dev/null || { echo "build-images: docker is not installed; run .ci/docker-up.sh" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-images: no Docker engine answers; run .ci/docker-up.sh" >&2; exit 1; }

if [ "$(docker image inspect -f '{{index .Config.Labels "org.astralvessel.rootfs"}}' "$base_image" 2>/dev/null || true)" = "$key" ]; then
    echo "build-images: $base_image is current ($key)"
else
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || {
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
        }
        work="$(mktemp -d "$cache/rootfs.XXXXXX")"
        trap 'rm -rf "$work"' EXIT
        echo "build-images: debootstrap $suite from $mirror (about a minute)"
        if ! debootstrap --variant=minbase --include="$packages" "$suite" "$work/root" "$mirror" \
            >"$work/debootstrap.log" 2>&1; then
            echo "build-images: debootstrap failed:" >&2
            tail -n 30 "$work/debootstrap.log" >&2
            exit 1
        fi
        # Documentation, caches and apt's lists are dead weight in a sandbox image.
        rm -rf "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* "$work/root"/usr/share/info/* \
            "$work/root"/usr/share/locale/* "$work/root"/var/cache/apt/* "$work/root"/var/lib/apt/lists/* \
            "$work/root"/var/log/* "$work/root"/tmp/*
        tar -C "$work/root" --numeric-owner -cf "$tarball.part" .
        mv "$tarball.part" "$tarball"
        rm -rf "$work"
        trap - EXIT
        # Keep only the current tarball.
        find "$cache" -maxdepth 1 -name "rootfs-$suite-*.tar" ! -name "$(basename "$tarball")" -delete
    else
        echo "build-images: reusing cached $tarball"
    fi
    echo "build-images: importing $base_image"
    docker import \
        --change "LABEL org.astralvessel.rootfs=$key" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        "$tarball" "$base_image" >/dev/null
fi

# The fallback image: the same system with every Python removed. The build
# cache makes this instant when the base did not change.
if ! out="$(DOCKER_BUILDKIT=0 docker build -q -t "$nopython_image" - 2>&1 <<DOCKERFILE
FROM $base_image
RUN rm -rf /usr/bin/python3* /usr/lib/python3* /usr/local/lib/python3* && ! command -v python3
DOCKERFILE
)"; then
    echo "build-images: building $nopython_image failed:" >&2
    echo "$out" >&2
    exit 1
fi

docker run --rm --network none "$base_image" sh -c 'python3 -c "import ctypes, json, select; print(\"python\", __import__(\"sys\").version.split()[0])" && rg --version | head -n1'
echo "build-images: ready: $base_image $nopython_image"
