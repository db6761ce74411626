"""Trees and archives for the snapshot tests: built on the host in ``tmp_path``, nothing faked."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from astralvessel._snapshot._archive import write_archive
from astralvessel._snapshot._manifest import Manifest
from astralvessel._snapshot._tree import scan_tree

#: Bounds far above every test tree, for the tests that are not about bounds.
ROOMY = {"max_bytes": 1 << 30, "max_files": 100_000}


def make_tree(root: Path) -> Path:
    """A small tree with one of each kind a snapshot keeps."""
    root.mkdir()
    (root / "notes.txt").write_bytes(b"hello\n")
    (root / "src").mkdir()
    (root / "src" / "main.py").write_bytes(b"print('hi')\n" * 100)
    (root / "src" / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "src" / "run.sh", 0o755)  # noqa: S103 - an executable kept as one
    (root / "empty").mkdir()
    os.symlink("main.py", root / "src" / "link")
    os.link(root / "notes.txt", root / "src" / "notes-again.txt")
    return root


def save(root: Path) -> tuple[Manifest, bytes]:
    """Scan ``root`` and return its manifest and its saved form."""
    manifest = scan_tree(root, **ROOMY)
    out = io.BytesIO()
    write_archive(root, manifest, out)
    return manifest, out.getvalue()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree of every kind of entry."""
    return make_tree(tmp_path / "tree")
