"""Settings and fixtures shared by the whole suite."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

# No registry is reachable where the tests run: the Docker backend's default base
# image is the one .ci/build-images.sh builds locally, unless the caller chose another.
os.environ.setdefault("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")

MakeAgent = Callable[..., Path]


@pytest.fixture
def make_agent(tmp_path: Path) -> MakeAgent:
    """Write ``vessel.toml`` and any tool files into a fresh folder and return it."""

    def make(vessel: str, files: dict[str, str] | None = None, *, name: str = "agent") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "vessel.toml").write_text(textwrap.dedent(vessel))
        for rel, text in (files or {}).items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return folder

    return make
