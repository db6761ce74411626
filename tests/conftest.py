"""Settings shared by the whole suite."""

from __future__ import annotations

import os

# No registry is reachable where the tests run: the Docker backend's default base
# image is the one .ci/build-images.sh builds locally, unless the caller chose another.
os.environ.setdefault("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")
