"""Settings and fixtures shared by the whole suite."""

from __future__ import annotations

import os
import tempfile
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


#: The length of ``long_tmp``'s path: a CI runner's workspace or a deep ``tmp_path`` is as
#: long, and a unix socket's address holds 107 bytes.
LONG_TMP_BYTES = 200


@pytest.fixture
def long_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's temporary folder for this test (``tempfile`` and ``TMPDIR``), its path
    ``LONG_TMP_BYTES`` long."""
    folder = tmp_path / ("t" * (LONG_TMP_BYTES - len(os.fsencode(tmp_path)) - 1))
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder
