"""scan_tree: what a host folder's manifest keeps, drops and refuses."""

from __future__ import annotations

import io
import os
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from astralvessel._executor._snapshot._archive import extract_archive
from astralvessel._executor._snapshot._manifest import EntryKind
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.errors import SnapshotError

from .conftest import ROOMY, entry_obj, manifest_json, member, save, tar_bytes


def _entries(root: Path) -> dict[bytes, tuple[EntryKind, int, int, bytes | None]]:
    return {
        entry.name: (entry.kind, entry.mode, entry.size, entry.target)
        for entry in scan_tree(root, **ROOMY).entries
    }


def test_fifo_is_refused(tmp_path: Path) -> None:
    """A fifo in the tree is refused by name."""
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SnapshotError, match="'pipe' is a fifo"):
        scan_tree(tmp_path, **ROOMY)


def test_socket_is_refused(tmp_path: Path) -> None:
    """A unix socket in the tree is refused by name."""
    os.mkdir(tmp_path / "run")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "run" / "s"))
        with pytest.raises(SnapshotError, match="'run/s' is a socket"):
            scan_tree(tmp_path, **ROOMY)


def test_setid_bits_dropped_with_a_note(tmp_path: Path) -> None:
    """Set-uid and set-gid bits are not kept, and the manifest's notes name the entries."""
    for name in ("su", "sg"):
        (tmp_path / name).write_bytes(b"#!/bin/sh\n")
    os.chmod(tmp_path / "su", 0o4755)  # noqa: S103 - the attack under test
    os.chmod(tmp_path / "sg", 0o2750)  # noqa: S103 - the attack under test
    manifest = scan_tree(tmp_path, **ROOMY)
    modes = {entry.name: entry.mode for entry in manifest.entries}
    assert modes == {b"sg": 0o750, b"su": 0o755}
    assert manifest.notes == ("set-id bits dropped from 2 entries: 'sg', 'su'",)


def test_sticky_bit_kept(tmp_path: Path) -> None:
    """A folder's sticky bit is a permission, and is kept."""
    (tmp_path / "shared").mkdir()
    os.chmod(tmp_path / "shared", 0o1777)  # noqa: S103 - the mode under test
    assert _entries(tmp_path)[b"shared"][1] == 0o1777


def test_sparse_file_kept_with_its_full_size(tmp_path: Path) -> None:
    """A sparse file keeps its bytes, holes as zeros, and counts its full size against the bound."""
    size = 8 << 20
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "sparse", "wb") as sparse:
        sparse.truncate(size)
        sparse.seek(size // 2)
        sparse.write(b"middle")
    manifest = scan_tree(tree, **ROOMY)
    assert manifest.total_bytes == size
    with pytest.raises(SnapshotError, match="more than max_bytes"):
        scan_tree(tree, max_bytes=size - 1, max_files=10)
    _, data = save(tree)
    out = tmp_path / "out"
    extract_archive(io.BytesIO(data), out, **ROOMY)
    restored = (out / "sparse").read_bytes()
    assert len(restored) == size
    assert restored[size // 2 : size // 2 + 6] == b"middle"


def test_names_that_are_not_utf8_kept(tmp_path: Path) -> None:
    """Names that are not UTF-8 are kept byte for byte, through the JSON and the archive."""
    tree = tmp_path / "tree"
    tree.mkdir()
    base = os.fsencode(tree)
    os.mkdir(base + b"/caf\xe9")
    with open(base + b"/caf\xe9/\xff\xfe", "wb") as odd:
        odd.write(b"x")
    os.symlink(b"\xff\xfe", base + b"/caf\xe9/link")
    _, data = save(tree)
    out = tmp_path / "out"
    manifest = extract_archive(io.BytesIO(data), out, **ROOMY)
    assert {entry.name for entry in manifest.entries} == {
        b"caf\xe9",
        b"caf\xe9/\xff\xfe",
        b"caf\xe9/link",
    }
    assert os.readlink(os.fsencode(out) + b"/caf\xe9/link") == b"\xff\xfe"
    assert scan_tree(out, **ROOMY) == manifest


def test_hard_links_keep_one_file(tmp_path: Path) -> None:
    """Three names of one file: the first in order holds the bytes, the others link to it."""
    (tmp_path / "b").write_bytes(b"shared")
    os.link(tmp_path / "b", tmp_path / "a")
    os.link(tmp_path / "b", tmp_path / "c")
    manifest = scan_tree(tmp_path, **ROOMY)
    assert [(entry.name, entry.kind, entry.target) for entry in manifest.entries] == [
        (b"a", EntryKind.FILE, None),
        (b"b", EntryKind.HARDLINK, b"a"),
        (b"c", EntryKind.HARDLINK, b"a"),
    ]
    assert manifest.total_bytes == len(b"shared")


def test_hard_link_to_outside_is_a_file(tmp_path: Path) -> None:
    """A file whose other name lies outside the tree is kept as a plain file, bytes and all."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tmp_path / "outside").write_bytes(b"mine")
    os.link(tmp_path / "outside", tree / "inside")
    assert _entries(tree)[b"inside"][0] is EntryKind.FILE


def test_symlinks_kept_as_written_not_followed(tmp_path: Path) -> None:
    """Symlinks out of the tree, dangling or to a folder are kept as links, never followed."""
    tree = tmp_path / "tree"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"no")
    tree.mkdir()
    (tree / "real").mkdir()
    os.symlink(tmp_path / "outside", tree / "out")
    os.symlink("../../etc/passwd", tree / "real" / "up")
    os.symlink("missing", tree / "dangling")
    os.symlink("real", tree / "inner")
    entries = _entries(tree)
    assert set(entries) == {b"dangling", b"inner", b"out", b"real", b"real/up"}
    assert entries[b"out"] == (EntryKind.SYMLINK, 0o777, 0, os.fsencode(tmp_path / "outside"))
    assert entries[b"real/up"][3] == b"../../etc/passwd"


def test_bounds_refuse_early(tmp_path: Path) -> None:
    """A tree past max_files or max_bytes is refused naming the bound."""
    for index in range(50):
        (tmp_path / f"f{index}").write_bytes(b"12345")
    with pytest.raises(SnapshotError, match="more than max_files=10"):
        scan_tree(tmp_path, max_bytes=1 << 20, max_files=10)
    with pytest.raises(SnapshotError, match="more than max_bytes=100"):
        scan_tree(tmp_path, max_bytes=100, max_files=1000)


def test_hard_links_count_against_max_files(tmp_path: Path) -> None:
    """Names of one file count one each against max_files, though they add no bytes."""
    (tmp_path / "one").write_bytes(b"x")
    for index in range(20):
        os.link(tmp_path / "one", tmp_path / f"link{index}")
    with pytest.raises(SnapshotError, match="more than max_files=10"):
        scan_tree(tmp_path, max_bytes=1 << 20, max_files=10)
    assert scan_tree(tmp_path, max_bytes=1 << 20, max_files=21).file_count == 21


@pytest.mark.parametrize("kind", ["file", "symlink", "missing"])
def test_root_must_be_a_folder(tmp_path: Path, kind: str) -> None:
    """A root that is a file, a symlink (even to a folder) or missing is refused."""
    root = tmp_path / "root"
    if kind == "file":
        root.write_bytes(b"")
    elif kind == "symlink":
        root.symlink_to(tmp_path)
    with pytest.raises(SnapshotError, match=r"not a folder|cannot be scanned"):
        scan_tree(root, **ROOMY)


def test_long_names_and_targets_round_trip(tmp_path: Path) -> None:
    """A 2000-byte name and a 3000-byte symlink target go through extended headers intact."""
    tree = tmp_path / "tree"
    deep = tree / "/".join(["d" * 200] * 9)
    deep.mkdir(parents=True)
    (deep / "leaf").write_bytes(b"deep")
    target = "/".join(["t" * 250] * 12)
    os.symlink(target, deep / "link")
    manifest, data = save(tree)
    out = tmp_path / "out"
    assert extract_archive(io.BytesIO(data), out, **ROOMY) == manifest
    assert os.readlink(out / deep.relative_to(tree) / "link") == target


def test_modes_restored_including_unwritable_folders(tmp_path: Path) -> None:
    """A read-only folder and a mode-0 file come back with their modes, the folder's children in."""
    entries = [
        entry_obj("none", mode=0),
        entry_obj("ro", "dir", mode=0o555),
        entry_obj("ro/inside", data=b"x", mode=0o400),
    ]
    members = [
        member("tree/none", mode=0),
        member("tree/ro", tarfile.DIRTYPE, mode=0o555),
        member("tree/ro/inside", data=b"x", mode=0o400),
    ]
    out = tmp_path / "out"
    extract_archive(io.BytesIO(tar_bytes(manifest_json(entries), members)), out, **ROOMY)
    try:
        assert stat.S_IMODE(os.stat(out / "ro").st_mode) == 0o555
        assert stat.S_IMODE(os.stat(out / "none").st_mode) == 0
        assert (out / "ro" / "inside").read_bytes() == b"x"
    finally:
        os.chmod(out / "ro", 0o755)  # noqa: S103 - so tmp_path can be removed


def test_unreadable_file_kept_by_root_refused_by_others(tmp_path: Path) -> None:
    """A mode-0 file is kept when the scanner may read it (root), else refused by name."""
    (tmp_path / "none").write_bytes(b"secret")
    os.chmod(tmp_path / "none", 0)
    if os.geteuid() == 0:
        assert _entries(tmp_path)[b"none"][:3] == (EntryKind.FILE, 0, 6)
    else:
        with pytest.raises(SnapshotError, match="'none' cannot be read: Permission denied"):
            scan_tree(tmp_path, **ROOMY)


def test_a_tree_nested_900_folders_deep_is_scanned(tmp_path: Path):
    """The walk is iterative: a tree as deep as a name may nest is scanned, not a
    RecursionError (two frames a level once)."""
    deep = tmp_path / "tree" / "/".join(["d"] * 900)
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"bottom")
    manifest = scan_tree(tmp_path / "tree", max_bytes=1 << 20, max_files=1000)
    assert manifest.file_count == 901
    assert manifest.entries[-1].name == b"/".join([b"d"] * 900) + b"/f"
