"""A tree saved and loaded back is the same tree, and the same tree saves to the same bytes."""

from __future__ import annotations

import io
import os
import stat
import subprocess
from pathlib import Path

import pytest

from astralvessel._executor._snapshot._archive import extract_archive, read_manifest, write_archive
from astralvessel._executor._snapshot._manifest import EntryKind, Manifest
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.errors import SnapshotError

from .conftest import ROOMY, make_tree, save


def test_round_trip_keeps_every_entry(tree: Path, tmp_path: Path) -> None:
    """Extracting a saved tree gives back the names, kinds, modes, links and bytes."""
    manifest, data = save(tree)
    out = tmp_path / "out"
    assert extract_archive(io.BytesIO(data), out, **ROOMY) == manifest
    assert scan_tree(out, **ROOMY).content_id == manifest.content_id
    assert os.readlink(out / "src" / "link") == "main.py"
    assert os.stat(out / "notes.txt").st_ino == os.stat(out / "src" / "notes-again.txt").st_ino
    assert stat.S_IMODE(os.stat(out / "src" / "run.sh").st_mode) == 0o755


def test_same_tree_same_bytes(tmp_path: Path) -> None:
    """Two copies of a tree, made at different times, save to identical archives."""
    first = make_tree(tmp_path / "one")
    second = make_tree(tmp_path / "two")
    os.utime(second / "notes.txt", (1, 1))
    assert save(first)[1] == save(second)[1]


def test_manifest_json_round_trip(tree: Path) -> None:
    """A manifest's canonical JSON reads back to an equal manifest with the same content id."""
    manifest = scan_tree(tree, **ROOMY)
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.content_id == manifest.content_id
    assert manifest.content_id.startswith("sha256:")


def test_read_manifest_reads_only_the_first_member(tree: Path) -> None:
    """read_manifest returns the manifest of a saved tree without reading its files."""
    manifest, data = save(tree)
    assert read_manifest(io.BytesIO(data)) == manifest


def test_stream_and_file_sources(tree: Path, tmp_path: Path) -> None:
    """A saved snapshot loads from a file on disk and from a pipe, which is spooled first."""
    manifest, data = save(tree)
    path = tmp_path / "saved.tar"
    path.write_bytes(data)
    with path.open("rb") as src:
        assert extract_archive(src, tmp_path / "from-file", **ROOMY) == manifest
    reader, writer = os.pipe()
    feeder = subprocess.Popen(["cat", str(path)], stdout=writer)
    os.close(writer)
    with os.fdopen(reader, "rb") as src:
        assert extract_archive(src, tmp_path / "from-pipe", **ROOMY) == manifest
    assert feeder.wait() == 0


def test_gnu_tar_reads_the_saved_form(tree: Path, tmp_path: Path) -> None:
    """The saved form is a plain POSIX tar: GNU tar lists the manifest first, then tree/."""
    _, data = save(tree)
    listing = subprocess.run(["tar", "-tf", "-"], input=data, capture_output=True, check=True)
    names = listing.stdout.decode().split()
    assert names[0] == "manifest.json"
    assert all(name.startswith("tree/") for name in names[1:])


def test_kinds_in_manifest(tree: Path) -> None:
    """Each kind of entry is recorded as its kind, the second name of a hard link as a link."""
    kinds = {entry.name: entry.kind for entry in scan_tree(tree, **ROOMY).entries}
    assert kinds[b"src/link"] is EntryKind.SYMLINK
    assert kinds[b"empty"] is EntryKind.DIR
    assert kinds[b"notes.txt"] is EntryKind.FILE
    assert kinds[b"src/notes-again.txt"] is EntryKind.HARDLINK


def test_write_archive_refuses_a_tree_changed_since_scan(tree: Path) -> None:
    """A file rewritten after the scan makes write_archive raise, not save other bytes."""
    manifest = scan_tree(tree, **ROOMY)
    (tree / "src" / "main.py").write_bytes(b"print('HI')\n" * 100)
    with pytest.raises(SnapshotError, match="changed since its manifest"):
        write_archive(tree, manifest, io.BytesIO())


def test_empty_tree_round_trips(tmp_path: Path) -> None:
    """An empty folder saves to a manifest and an end, and loads to an empty folder."""
    (tmp_path / "empty").mkdir()
    manifest, data = save(tmp_path / "empty")
    assert (manifest.file_count, manifest.total_bytes, manifest.entries) == (0, 0, ())
    assert extract_archive(io.BytesIO(data), tmp_path / "out", **ROOMY) == manifest
    assert list((tmp_path / "out").iterdir()) == []


def test_stream_position_is_where_the_archive_starts(tree: Path, tmp_path: Path) -> None:
    """An archive after other bytes in a file loads from the file's current position."""
    manifest, data = save(tree)
    path = tmp_path / "framed"
    path.write_bytes(b"HEADER" + data)
    with path.open("rb") as src:
        src.read(6)
        assert extract_archive(src, tmp_path / "out", **ROOMY) == manifest


def test_gnu_tar_unpacks_the_same_tree(tree: Path, tmp_path: Path) -> None:
    """GNU tar unpacks the saved form's tree/ to a tree with the same content id."""
    base = os.fsencode(tree)
    with open(base + b"/caf\xe9", "wb") as odd:
        odd.write(b"latin-1 name")
    (tree / ("long-" * 40)).write_bytes(b"a long name")
    manifest, data = save(tree)
    out = tmp_path / "unpacked"
    out.mkdir()
    subprocess.run(["tar", "-xpf", "-", "-C", str(out)], input=data, check=True)
    assert scan_tree(out / "tree", **ROOMY).content_id == manifest.content_id
