"""Fixtures for the Docker backend's own tests: a real engine and the offline test images.

``.ci/build-images.sh`` builds the images; ``ASTRALVESSEL_DOCKER_IMAGE`` may name
another base image. A missing engine or image fails the tests, never skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import Limits, Policy, SandboxSession
from astralvessel.sandbox.docker import Docker

#: The base image with python3 and ripgrep, built offline by .ci/build-images.sh.
BASE_IMAGE = os.environ.get("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")
#: The same system without any Python: the exec-per-call fallback.
NOPYTHON_IMAGE = "astralvessel-test/nopython:bookworm"
SMALL_LIMITS = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)


@pytest.fixture(scope="session")
def docker_api() -> object:
    """A low-level client of the local engine; fails loudly if none answers."""
    import docker

    client = docker.from_env(version="auto")
    try:
        client.ping()
    except Exception as exc:
        pytest.fail(f"no Docker engine answers ({exc}); run .ci/docker-up.sh", pytrace=False)
    for image in (BASE_IMAGE, NOPYTHON_IMAGE):
        try:
            client.api.inspect_image(image)
        except Exception:
            pytest.fail(f"test image {image} is missing; run .ci/build-images.sh", pytrace=False)
    yield client.api
    client.close()


@pytest.fixture
def backend(docker_api: object) -> Docker:
    """The Docker backend on the offline base image, never pulling."""
    return Docker(base_image=BASE_IMAGE, pull=False)


@pytest.fixture
def small_policy() -> Policy:
    """A policy with small limits and no agent folder."""
    return Policy(limits=SMALL_LIMITS)


@pytest.fixture
def turn(backend: Docker, small_policy: Policy) -> Iterator[SandboxSession]:
    """A running Docker turn, closed after the test."""
    session = backend.start(small_policy)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def agent_with_dockerfile(tmp_path: Path) -> Path:
    """An agent folder whose ``[sandbox] dockerfile`` adds a marker file to the base image."""
    agent = tmp_path / "agent"
    (agent / "sandbox").mkdir(parents=True)
    (agent / "vessel.toml").write_text(
        'name = "docker-test"\n[tools]\nbuiltin = ["read"]\n[sandbox]\ndockerfile = "sandbox/Dockerfile"\n'
    )
    # A unique marker per test run, so the content hash (and so the build) is fresh.
    marker = os.urandom(6).hex()
    (agent / "sandbox" / "marker.txt").write_text(f"image marker {marker}\n")
    (agent / "sandbox" / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY marker.txt /usr/share/vessel-marker.txt\n"
    )
    for path in (tmp_path, agent, agent / "sandbox"):
        path.chmod(0o755)
    return agent
