"""Trees and archives for the snapshot tests: built on the host in ``tmp_path``, nothing faked."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from astralvessel._executor._snapshot._archive import extract_archive, write_archive
from astralvessel._executor._snapshot._manifest import Manifest
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.errors import SnapshotError

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


# -- archives by hand: what an attacker (or a broken sandbox) could send ------------------


def entry_obj(
    name: str, kind: str = "file", data: bytes = b"", mode: int = 0o644, target: str | None = None
) -> dict[str, object]:
    """A manifest entry's JSON object, unchecked."""
    is_file = kind == "file"
    return {
        "digest": hashlib.sha256(data).hexdigest() if is_file else None,
        "kind": kind,
        "mode": mode,
        "name": name,
        "size": len(data) if is_file else 0,
        "target": target,
    }


def manifest_json(entries: list[dict[str, object]], **changes: object) -> bytes:
    """A manifest's canonical JSON around these entries, totals and content id as they add up."""
    canonical = json.dumps(entries, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
    obj: dict[str, object] = {
        "content_id": "sha256:" + hashlib.sha256(canonical.encode()).hexdigest(),
        "entries": entries,
        "file_count": len(entries),
        "format_version": 1,
        "notes": [],
        "total_bytes": sum(int(str(entry["size"])) for entry in entries),
    }
    obj.update(changes)
    return json.dumps(obj, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode()


def member(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    *,
    data: bytes = b"",
    mode: int = 0o644,
    link: str = "",
    size: int | None = None,
) -> tuple[tarfile.TarInfo, bytes]:
    """One tar member as tarfile writes it; ``size`` may claim other than the data's length."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    info.size = len(data) if size is None else size
    return info, data


def tar_bytes(
    manifest: bytes | None,
    members: list[tuple[tarfile.TarInfo, bytes]],
    fmt: int = tarfile.PAX_FORMAT,
) -> bytes:
    """An archive written by tarfile: the manifest first (when given), then these members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, errors="surrogateescape") as tar:
        if manifest is not None:
            info, data = member("manifest.json", data=manifest)
            tar.addfile(info, io.BytesIO(data))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def listing(root: Path) -> list[tuple[str, int]]:
    """Every path under ``root`` with its size, to compare before and after a refusal."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            found.append((path, os.lstat(path).st_size))
    return sorted(found)


def assert_refused(data: bytes, tmp_path: Path, match: str, **bounds: int) -> None:
    """Extracting ``data`` raises SnapshotError matching ``match``, and writes nothing anywhere."""
    dest = tmp_path / "dest"
    before = listing(tmp_path)
    with pytest.raises(SnapshotError, match=match):
        extract_archive(io.BytesIO(data), dest, **(ROOMY | bounds))
    assert not dest.exists()
    assert listing(tmp_path) == before
