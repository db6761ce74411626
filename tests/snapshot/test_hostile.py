"""Hostile, truncated and tampered archives: each refused by name, nothing written anywhere."""

from __future__ import annotations

import io
import os
import resource
import signal
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from astralvessel._executor._snapshot._archive import archive_limit, extract_archive, read_manifest
from astralvessel._executor._snapshot._tar import BLOCK, member_header
from astralvessel.errors import SnapshotError, UsageError

from .conftest import (
    ROOMY,
    assert_refused,
    entry_obj,
    listing,
    manifest_json,
    member,
    save,
    tar_bytes,
)

HELLO = b"hello\n"


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def honest() -> tuple[list[dict[str, object]], list[tuple[tarfile.TarInfo, bytes]]]:
    """A folder with one file in it, as manifest entries and as tar members."""
    entries = [entry_obj("d", "dir", mode=0o755), entry_obj("d/a", data=HELLO)]
    members = [member("tree/d", tarfile.DIRTYPE, mode=0o755), member("tree/d/a", data=HELLO)]
    return entries, members


def test_hand_made_honest_archive_is_accepted(tmp_path: Path) -> None:
    """An archive tarfile writes in the saved form's shape loads (the tests' baseline)."""
    entries, members = honest()
    data = tar_bytes(manifest_json(entries), members)
    extract_archive(io.BytesIO(data), tmp_path / "dest", **ROOMY)
    assert (tmp_path / "dest" / "d" / "a").read_bytes() == HELLO


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("tree/../evil", "'..' component"),
        ("tree/d/../../evil", "'..' component"),
        ("/tmp/evil", "not under tree/"),
        ("tree//etc/evil", "absolute name"),
        ("tree/d//evil", "empty component"),
        ("tree/./evil", "'.' component"),
        ("../evil", "not under tree/"),
    ],
)
def test_member_names_leaving_the_tree_are_refused(tmp_path: Path, name: str, problem: str) -> None:
    """A member whose name climbs out, is absolute or has an empty or `.` part is refused."""
    entries, members = honest()
    members[1] = member(name, data=HELLO)
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, problem)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../evil", "'..' component"),
        ("d/../../evil", "'..' component"),
        ("/etc/evil", "absolute name"),
        ("", "empty name"),
        ("d//a", "empty component"),
        ("d/", "empty component"),
        (".", "'.' component"),
        ("d/a\x00b", "NUL byte"),
        ("x" * 256, "longer than 255"),
    ],
)
def test_manifest_names_leaving_the_tree_are_refused(
    tmp_path: Path, name: str, problem: str
) -> None:
    """A manifest that itself lists a hostile name is refused before any member is read."""
    entries = [entry_obj(name, data=HELLO)]
    members = [member("tree/" + name, data=HELLO)]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, problem)


def test_nothing_under_a_symlink(tmp_path: Path) -> None:
    """A file listed under a symlink (which would be written through it) is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [
        entry_obj("l", "symlink", mode=0o777, target=str(outside)),
        entry_obj("l/x", data=HELLO),
    ]
    members = [
        member("tree/l", tarfile.SYMTYPE, mode=0o777, link=str(outside)),
        member("tree/l/x", data=HELLO),
    ]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "not under a folder")
    assert not (outside / "x").exists()


def test_symlink_out_is_kept_and_not_followed(tmp_path: Path) -> None:
    """A symlink pointing out of the tree is restored as written; nothing is written through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [
        entry_obj("l", "symlink", mode=0o777, target=str(outside)),
        entry_obj("m", data=HELLO),
    ]
    members = [
        member("tree/l", tarfile.SYMTYPE, mode=0o777, link=str(outside)),
        member("tree/m", data=HELLO),
    ]
    extract_archive(
        io.BytesIO(tar_bytes(manifest_json(entries), members)), tmp_path / "dest", **ROOMY
    )
    assert os.readlink(tmp_path / "dest" / "l") == str(outside)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("/etc/passwd", "hard link to an absolute name"),
        ("../outside", "hard link to a '..' component"),
        ("z", "not a regular file listed before it"),
        ("d", "not a regular file listed before it"),
        ("s", "not a regular file listed before it"),
    ],
)
def test_manifest_hard_links_out_or_forward_are_refused(
    tmp_path: Path, target: str, problem: str
) -> None:
    """A hard link must name a regular file listed before it: not outside, later, a folder or link."""
    entries = [
        entry_obj("d", "dir", mode=0o755),
        entry_obj("link", "hardlink", target=target),
        entry_obj("s", "symlink", mode=0o777, target="d"),
        entry_obj("z", data=HELLO),
    ]
    members = [
        member("tree/d", tarfile.DIRTYPE, mode=0o755),
        member("tree/link", tarfile.LNKTYPE, link="tree/" + target),
        member("tree/s", tarfile.SYMTYPE, mode=0o777, link="d"),
        member("tree/z", data=HELLO),
    ]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, problem)


@pytest.mark.parametrize("link", ["/etc/passwd", "tree/../../etc/passwd", "tree/d/b", "etc"])
def test_member_hard_link_elsewhere_than_its_entry_is_refused(tmp_path: Path, link: str) -> None:
    """A hard-link member that points anywhere but its entry's target is refused."""
    entries = [entry_obj("a", data=HELLO), entry_obj("b", "hardlink", target="a")]
    members = [member("tree/a", data=HELLO), member("tree/b", tarfile.LNKTYPE, link=link)]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "links elsewhere")


def test_symlink_member_target_must_agree(tmp_path: Path) -> None:
    """A symlink member whose target differs from its entry's is refused."""
    entries = [entry_obj("l", "symlink", mode=0o777, target="a")]
    members = [member("tree/l", tarfile.SYMTYPE, mode=0o777, link="/etc")]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "links elsewhere")


def test_huge_claimed_member_size_is_truncation(tmp_path: Path) -> None:
    """A member claiming 8 GiB that the archive does not hold is refused as truncated."""
    entries = [entry_obj("a", data=HELLO)]
    info, _ = member("tree/a", size=8**11 - 1)
    data = tar_bytes(manifest_json(entries), [])
    data = data[: -2 * BLOCK] if data.endswith(bytes(2 * BLOCK)) else data
    end = data.rstrip(b"\0")
    cut = len(end) + (-len(end) % BLOCK)
    hostile = data[:cut] + info.tobuf(tarfile.PAX_FORMAT) + HELLO + bytes(BLOCK - len(HELLO))
    assert_refused(hostile, tmp_path, "claims 8589934591 bytes")


def test_huge_claimed_manifest_totals_are_refused_before_reading(tmp_path: Path) -> None:
    """A manifest claiming more bytes than max_bytes is refused before any member."""
    entries = [entry_obj("a", data=b"x" * 5000)]
    data = tar_bytes(manifest_json(entries), [member("tree/a", data=b"x" * 5000)])
    assert_refused(data, tmp_path, "past max_bytes=4096", max_bytes=4096)


def test_huge_pax_size_record_is_refused(tmp_path: Path) -> None:
    """An extended header claiming a petabyte for a member is refused as truncated."""
    entries = [entry_obj("a", data=HELLO)]
    manifest = manifest_json(entries)
    head = member_header(b"manifest.json", b"0", 0o644, len(manifest))
    hostile = member_header(b"tree/a", b"0", 0o644, 10**15)
    archive = head + _padded(manifest) + hostile + _padded(HELLO) + bytes(2 * BLOCK)
    assert_refused(archive, tmp_path, "claims 1000000000000000 bytes")


def test_truncation_at_every_block_is_refused(tree: Path, tmp_path: Path) -> None:
    """An archive cut at any block or inside one is refused as truncated, nothing written."""
    _, data = save(tree)
    cuts = sorted({*range(0, len(data), BLOCK), *range(100, len(data), BLOCK)})
    for cut in cuts:
        assert_refused(data[:cut], tmp_path, "truncated")


def test_manifest_listing_more_than_the_archive_holds(tmp_path: Path) -> None:
    """A manifest entry without its member is refused."""
    entries, members = honest()
    entries.append(entry_obj("e", data=b""))
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "ends before entry 'e'")


def test_member_not_in_the_manifest(tmp_path: Path) -> None:
    """A member the manifest does not list is refused."""
    entries, members = honest()
    members.append(member("tree/extra", data=b"x"))
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "'tree/extra' is not in")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: member("tree/d/a", data=b"HELLO\n"), "do not match their digest"),
        (lambda m: member("tree/d/a", data=HELLO, mode=0o755), "has mode 0o755"),
        (lambda m: member("tree/d/a", data=HELLO, mode=0o4644), "has mode 0o4644"),
        (lambda m: member("tree/d/a", data=HELLO + b"!"), "holds 7 bytes"),
        (lambda m: member("tree/d/a", tarfile.DIRTYPE), "is a dir"),
        (lambda m: member("tree/d/b", data=HELLO), "is 'd/b' where the manifest lists 'd/a'"),
    ],
)
def test_member_disagreeing_with_its_entry(tmp_path: Path, change: object, problem: str) -> None:
    """A member whose bytes, mode, size, kind or name differ from its entry is refused."""
    entries, members = honest()
    members[1] = change(members[1])  # type: ignore[operator]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, problem)


def test_members_out_of_order(tmp_path: Path) -> None:
    """Members in another order than the manifest's are refused."""
    entries = [entry_obj("a", data=HELLO), entry_obj("b", data=HELLO)]
    members = [member("tree/b", data=HELLO), member("tree/a", data=HELLO)]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, "is 'b' where")


def test_duplicate_names(tmp_path: Path) -> None:
    """A name listed twice in the manifest, or a member given twice, is refused."""
    twice = [entry_obj("a", data=HELLO), entry_obj("a", data=HELLO)]
    members = [member("tree/a", data=HELLO), member("tree/a", data=HELLO)]
    assert_refused(tar_bytes(manifest_json(twice), members), tmp_path, "named twice")
    once = [entry_obj("a", data=HELLO)]
    assert_refused(tar_bytes(manifest_json(once), members), tmp_path, "not in the manifest")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"content_id": "sha256:" + "0" * 64}, "hash to"),
        ({"file_count": 1}, "file_count 1 but 2 entries"),
        ({"total_bytes": 0}, "total_bytes 0 but the files hold 6"),
        ({"format_version": 2}, "format version 2"),
        ({"extra": 1}, "not an object with keys"),
        ({"notes": [1]}, "manifest"),
        ({"total_bytes": True}, "not an integer"),
    ],
)
def test_tampered_manifest(tmp_path: Path, changes: dict[str, object], problem: str) -> None:
    """A manifest whose id, counts, version or keys do not hold is refused."""
    entries, members = honest()
    data = tar_bytes(manifest_json(entries, **changes), members)
    assert_refused(data, tmp_path, problem)


def test_manifest_not_canonical(tmp_path: Path) -> None:
    """A manifest with the right values in another spelling is refused as rewritten."""
    entries, members = honest()
    spaced = manifest_json(entries).replace(b'"d/a"', b'"d\\/a"')
    assert_refused(tar_bytes(spaced, members), tmp_path, "not in canonical form")


@pytest.mark.parametrize("garbage", [b"", b"not json", b"[]", b'{"entries": {}}', b"[" * 100_000])
def test_manifest_not_a_manifest(tmp_path: Path, garbage: bytes) -> None:
    """A manifest member that is not JSON, or not the manifest's shape, is refused."""
    assert_refused(tar_bytes(garbage, []), tmp_path, "manifest")


def test_no_manifest_first(tmp_path: Path) -> None:
    """An archive whose first member is not manifest.json is not a snapshot."""
    entries, members = honest()
    data = tar_bytes(None, [member("manifest.json", data=manifest_json(entries)), *members][::-1])
    assert_refused(data, tmp_path, "first member is not manifest.json")
    with pytest.raises(SnapshotError, match="first member"):
        read_manifest(io.BytesIO(data))
    assert_refused(b"\x1f\x8b" + bytes(1000), tmp_path, "not a POSIX ustar header")


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        (tarfile.CHRTYPE, "a character device"),
        (tarfile.BLKTYPE, "a block device"),
        (tarfile.FIFOTYPE, "a fifo"),
        (tarfile.CONTTYPE, "a contiguous file"),
        (b"Z", "unknown type"),
    ],
)
def test_special_members_are_refused(tmp_path: Path, kind: bytes, what: str) -> None:
    """A device, fifo or unknown member type is refused, whatever the manifest says."""
    entries = [entry_obj("dev", data=b"")]
    members = [member("tree/dev", kind)]
    assert_refused(tar_bytes(manifest_json(entries), members), tmp_path, what)


def test_gnu_long_names_are_refused(tmp_path: Path) -> None:
    """GNU's long-name members, which the saved form never has, are refused."""
    long = b"tree/" + b"a" * 150
    manifest = manifest_json([entry_obj("a" * 150, data=HELLO)])
    data = b"".join(
        (
            member_header(b"manifest.json", b"0", 0o644, len(manifest)),
            _padded(manifest),
            member_header(b"././@LongLink", b"L", 0o644, len(long) + 1),
            _padded(long + b"\0"),
            member_header(long[:100], b"0", 0o644, len(HELLO)),
            _padded(HELLO),
            bytes(2 * BLOCK),
        )
    )
    assert_refused(data, tmp_path, "GNU long name")
    gnu = tar_bytes(manifest, [member(long.decode(), data=HELLO)], tarfile.GNU_FORMAT)
    assert_refused(gnu, tmp_path, "not a POSIX ustar header")


def test_extended_attribute_records_are_refused(tmp_path: Path) -> None:
    """A pax record the saved form has not (a file capability, say) is refused, not ignored."""
    entries = [entry_obj("a", data=HELLO)]
    info, data = member("tree/a", data=HELLO)
    info.pax_headers = {"SCHILY.xattr.security.capability": "\x01"}
    assert_refused(tar_bytes(manifest_json(entries), [(info, data)]), tmp_path, "SCHILY.xattr")


def test_bad_header_checksum(tree: Path, tmp_path: Path) -> None:
    """A header whose checksum does not match is refused."""
    _, data = save(tree)
    hostile = bytearray(data)
    hostile[108] ^= 1  # the manifest's uid field
    assert_refused(bytes(hostile), tmp_path, "checksum mismatch")


def test_data_after_the_end(tree: Path, tmp_path: Path) -> None:
    """Bytes after the archive's end marker are refused as tampering."""
    _, data = save(tree)
    assert_refused(data + b"x" + bytes(BLOCK - 1), tmp_path, "after the archive's end")
    assert_refused(data + bytes(100 * BLOCK), tmp_path, "after the archive's end")


def test_bytes_in_padding(tree: Path, tmp_path: Path) -> None:
    """A byte hidden in the padding after a member's data is refused as tampering."""
    manifest, data = save(tree)
    hostile = bytearray(data)
    hostile[BLOCK + len(manifest.to_json())] = 1
    assert_refused(bytes(hostile), tmp_path, "padding")


def test_dest_must_be_empty(tree: Path, tmp_path: Path) -> None:
    """A destination that holds something, is a file or a symlink is the host's mistake."""
    _, data = save(tree)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_bytes(b"")
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    for dest in (full, tmp_path / "file", tmp_path / "link"):
        with pytest.raises(UsageError, match="empty folder"):
            extract_archive(io.BytesIO(data), dest, **ROOMY)
    extract_archive(io.BytesIO(data), tmp_path / "empty", **ROOMY)
    assert (tmp_path / "empty" / "notes.txt").exists()


def test_refusal_empties_an_existing_dest(tree: Path, tmp_path: Path) -> None:
    """A refused archive leaves an empty destination it was given empty, not removed."""
    _, data = save(tree)
    dest = tmp_path / "given"
    dest.mkdir()
    with pytest.raises(SnapshotError):
        extract_archive(io.BytesIO(data[: -BLOCK * 3]), dest, **ROOMY)
    assert dest.is_dir()
    assert list(dest.iterdir()) == []


class _Tiny(io.RawIOBase):
    """A stream of an archive of a million empty files, made as it is read; counts what was read."""

    def __init__(self, files: int) -> None:
        self.files = files
        self.given = 0
        self.pending = bytearray()
        self.made = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        while len(self.pending) < len(buffer) and self.made < self.files:
            self.pending += member_header(b"tree/f%07d" % self.made, b"0", 0o644, 0)
            self.made += 1
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        del self.pending[:size]
        self.given += size
        return size


def test_a_million_tiny_files_refused_by_max_files(tmp_path: Path) -> None:
    """A stream of a million empty files stops being read at the bounds' size and is refused."""
    stream = _Tiny(1_000_000)
    bounds = {"max_bytes": 1 << 20, "max_files": 1000}
    with pytest.raises(SnapshotError, match="larger than its bounds allow"):
        extract_archive(io.BufferedReader(stream), tmp_path / "dest", **bounds)
    assert stream.given <= archive_limit(**bounds) + (2 << 20)
    assert stream.made < 1_000_000
    assert not (tmp_path / "dest").exists()


def test_manifest_of_too_many_entries_refused(tmp_path: Path) -> None:
    """A manifest listing more entries than max_files is refused before its members are read."""
    entries = [entry_obj(f"f{index:04d}") for index in range(50)]
    members = [member(f"tree/f{index:04d}") for index in range(50)]
    data = tar_bytes(manifest_json(entries), members)
    assert_refused(data, tmp_path, "50 entries, past max_files=49", max_files=49)
    assert_refused(data, tmp_path, "past the bound", max_files=0)


def test_refusal_leaves_listing_unchanged(tree: Path, tmp_path: Path) -> None:
    """The helper's own check: a successful extraction does change the listing."""
    _, data = save(tree)
    before = listing(tmp_path)
    extract_archive(io.BytesIO(data), tmp_path / "dest", **ROOMY)
    assert listing(tmp_path) != before


def test_dest_parent_missing(tree: Path, tmp_path: Path) -> None:
    """A destination whose parent does not exist is the host's mistake, named."""
    _, data = save(tree)
    with pytest.raises(UsageError, match="parent folder does not exist"):
        extract_archive(io.BytesIO(data), tmp_path / "no" / "dest", **ROOMY)


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (not a signal) while this lasts."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_write_failure_removes_what_was_written(tmp_path: Path) -> None:
    """A file the disk refuses midway (EFBIG here) raises SnapshotError and removes dest whole."""
    tree = tmp_path / "tree"
    (tree / "ro").mkdir(parents=True)
    (tree / "ro" / "a-small").write_bytes(b"x")
    (tree / "z-big").write_bytes(b"y" * 100_000)
    os.chmod(tree / "ro", 0o555)  # noqa: S103 - written last, undone first
    try:
        _, data = save(tree)
    finally:
        os.chmod(tree / "ro", 0o755)  # noqa: S103 - so tmp_path can be removed
    dest = tmp_path / "dest"
    with _file_size_limit(50_000), pytest.raises(SnapshotError, match="cannot be written"):
        extract_archive(io.BytesIO(data), dest, **ROOMY)
    assert not dest.exists()
