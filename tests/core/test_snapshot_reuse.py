"""Incremental captures: which files the host links rather than reads, played with no sandbox.

The capture plan is driven as the turn drives it, with listings a sandbox could
send: a file is linked only when the store holds it with certainty (unchanged
since the last capture by a stat recorded outside the racy window, or still the
lower layer's of the snapshot the turn opened from, with the same size and
mode), and one held inode serves one name. The conformance suite runs the real
sandboxes (``test_snapshot_reuse``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

from astralvessel import SnapshotError, TurnSnapshot
from astralvessel._executor._snapshot._capture import capture
from astralvessel._executor._snapshot._manifest import Entry, EntryKind
from astralvessel._executor._snapshot._reuse import RACY_NS, Captures
from astralvessel._executor._snapshot._store import Budget
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.sandbox import FsReply, FsRequest

#: A capture's start, in ns; files older than the racy window by default.
NOW = 10**18
OLD = NOW - 10 * RACY_NS


def _file(name: str, data: bytes, ino: int, *, when: int = OLD, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "file",
        "mode": 0o644,
        "size": len(data),
        "target": None,
        "stat": [ino, when, when],
        **extra,
    }


def _take(
    captures: Captures | None, listing: list[dict[str, Any]], files: dict[str, bytes]
) -> tuple[TurnSnapshot, list[str]]:
    """Drive one capture: the snapshot and the names whose bytes it asked for."""
    plan: Generator[FsRequest, FsReply, TurnSnapshot] = capture(
        timeout=5.0, max_bytes=1 << 20, max_files=100, budget=Budget(1 << 30), captures=captures
    )
    next(plan)
    reply = FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode())
    asked: list[str] = []
    while True:
        try:
            request = plan.send(reply)
        except StopIteration as done:
            return done.value, asked
        wanted = json.loads(request.data)
        asked += [name for name, offset, _ in wanted if offset == 0]
        reply = FsReply(data=b"".join(files[n][o : o + k] for n, o, k in wanted))


def _ino(snapshot: TurnSnapshot, name: str) -> int:
    return os.stat(snapshot.path / name).st_ino


def _full_id(snapshot: TurnSnapshot) -> str:
    return scan_tree(snapshot.path, max_bytes=1 << 30, max_files=100).content_id


def test_an_unchanged_file_is_linked_and_the_id_is_a_full_captures():
    """A file whose stat is the last capture's is linked, not read; same files, same id."""
    captures = Captures(None)
    listing = [_file("a", b"alpha", 1), _file("b", b"beta", 2)]
    files = {"a": b"alpha", "b": b"beta"}
    first, asked = _take(captures, listing, files)
    assert asked == ["a", "b"]
    second, asked = _take(captures, listing, files)
    assert asked == []
    assert _ino(second, "a") == _ino(first, "a")
    assert second.content_id == first.content_id == _full_id(second)


def test_a_file_changed_within_the_racy_window_is_read_again():
    """A file whose times are within a tick of the capture's start is not recorded: the
    next capture reads it even if its stat looks the same (it may have changed after)."""
    captures = Captures(None)
    listing = [_file("a", b"alpha", 1, when=NOW - RACY_NS // 2), _file("b", b"beta", 2)]
    first, _ = _take(captures, listing, {"a": b"alpha", "b": b"beta"})
    second, asked = _take(captures, listing, {"a": b"ALPHA", "b": b"beta"})
    assert asked == ["a"]
    assert (second.path / "a").read_bytes() == b"ALPHA"
    assert second.content_id == _full_id(second)
    assert _ino(second, "b") == _ino(first, "b")


def test_any_change_of_the_stat_reads_the_file():
    """Another inode, size, mtime or ctime: the file is read."""
    captures = Captures(None)
    kept = [_take(captures, [_file("a", b"alpha", 1)], {"a": b"alpha"})]
    for changed in ([9, OLD, OLD], [1, OLD + 1, OLD], [1, OLD, OLD + 1]):
        listing = [dict(_file("a", b"other", 1), stat=changed)]
        snapshot, asked = _take(captures, listing, {"a": b"other"})
        assert asked == ["a"]
        assert (snapshot.path / "a").read_bytes() == b"other"
        kept.append(_take(captures, [_file("a", b"alpha", 1)], {"a": b"alpha"}))


def test_the_captures_are_held_weakly():
    """A capture no one keeps is gone: the next links from the newest still alive, or
    reads every file when none is."""
    captures = Captures(None)
    listing = [_file("a", b"alpha", 1)]
    first, _ = _take(captures, listing, {"a": b"alpha"})
    second, _ = _take(captures, listing, {"a": b"alpha"})
    del second
    third, asked = _take(captures, listing, {"a": b"alpha"})
    assert asked == []
    assert _ino(third, "a") == _ino(first, "a")
    del first, third
    _, asked = _take(captures, listing, {"a": b"alpha"})
    assert asked == ["a"]


def test_a_lower_mark_links_the_sources_file_only():
    """``lower`` links the source's file of that name when its size and mode agree;
    a mark on a name the source lacks, or without a source, is read."""
    files = {"a": b"alpha", "m": b"mode", "n": b"new"}
    source, _ = _take(None, [_file("a", b"alpha", 1), _file("m", b"mode", 2)], files)
    listing = [
        _file("a", b"alpha", 5, lower=True),
        _file("m", b"mode", 6, lower=True) | {"mode": 0o600},
        _file("n", b"new", 7, lower=True),
    ]
    snapshot, asked = _take(Captures(source), listing, files)
    assert asked == ["m", "n"]
    assert _ino(snapshot, "a") == _ino(source, "a")
    assert snapshot.content_id == _full_id(snapshot)
    _, asked = _take(Captures(None), listing, files)
    assert asked == ["a", "m", "n"]


def test_a_turn_frozen_above_its_source_never_links_the_sources_files():
    """Once a fork's own layer is frozen (stacked) the turn lies on that snapshot: a file
    its new upper layer lacks is that one's, never the source's, which the fork may have
    changed before the freeze. Where the host lost that layer, nothing is linked."""
    files = {"a": b"alpha"}
    source, _ = _take(None, [_file("a", b"alpha", 1)], files)
    changed = {"a": b"ALPHA"}
    listing = [_file("a", b"ALPHA", 5, lower=True)]
    stacked, _ = _take(None, [_file("a", b"ALPHA", 3)], changed)
    captures = Captures(source)
    assert captures.stacks()
    captures.frozen(stacked)
    assert not captures.stacks()
    snapshot, asked = _take(captures, listing, changed)
    assert asked == []
    assert _ino(snapshot, "a") == _ino(stacked, "a")
    lost = Captures(source)
    lost.lost()
    snapshot, asked = _take(lost, listing, changed)
    assert asked == ["a"]
    assert (snapshot.path / "a").read_bytes() == b"ALPHA"
    assert not lost.stacks()


def test_one_held_inode_serves_one_name():
    """Two names the listing shows as two files are never one inode: the second is read."""
    source, _ = _take(
        None,
        [_file("a", b"same", 1), {**_file("b", b"", 1), "kind": "hardlink", "target": "a"}],
        {"a": b"same"},
    )
    listing = [_file("a", b"same", 1, lower=True), _file("b", b"same", 2, lower=True)]
    snapshot, asked = _take(Captures(source), listing, {"a": b"same", "b": b"same"})
    assert asked == ["b"]
    assert _ino(snapshot, "a") != _ino(snapshot, "b")
    assert snapshot.content_id == _full_id(snapshot)


def test_a_digest_given_later_is_checked():
    """An entry given its digest once its bytes are in keeps its fields, and takes only a
    digest in the manifest's form, for a regular file only."""
    entry = Entry(name=b"d/f", kind=EntryKind.FILE, mode=0o640, size=3, digest="0" * 64)
    given = entry.with_digest("a" * 64)
    assert given == Entry(name=b"d/f", kind=EntryKind.FILE, mode=0o640, size=3, digest="a" * 64)
    with pytest.raises(SnapshotError, match="64 hex"):
        entry.with_digest("A" * 64)
    with pytest.raises(TypeError):
        Entry(name=b"d", kind=EntryKind.DIR, mode=0o755).with_digest("a" * 64)


@pytest.mark.parametrize("server_marks", [False, True])
def test_an_upper_layer_the_host_could_not_read_marks_nothing_lower(server_marks: bool):
    """Where the host laid the overlay and its upper layer could not be read whole
    (``upper_read`` False), every file is read: none is taken for the source's, whatever the
    server marked. Read whole, a name the layer lacks is linked."""
    files = {"a": b"alpha", "b": b"beta"}
    source, _ = _take(None, [_file("a", b"alpha", 1), _file("b", b"beta", 2)], files)
    listing = [
        _file(name, data, 5 + i, lower=server_marks) for i, (name, data) in enumerate(files.items())
    ]

    def take(upper_names: frozenset[bytes], upper_read: bool) -> list[str]:
        plan = capture(
            timeout=5.0, max_bytes=1 << 20, max_files=100, budget=Budget(1 << 30),
            captures=Captures(source),
        )  # fmt: skip
        next(plan)
        reply = FsReply(
            fields={"now_ns": NOW}, data=json.dumps(listing).encode(),
            upper_names=upper_names, upper_read=upper_read,
        )  # fmt: skip
        asked: list[str] = []
        while True:
            try:
                request = plan.send(reply)
            except StopIteration:
                return asked
            wanted = json.loads(request.data)
            asked += [name for name, offset, _ in wanted if offset == 0]
            reply = FsReply(data=b"".join(files[n][o : o + k] for n, o, k in wanted))

    assert take(frozenset(), upper_read=False) == ["a", "b"]
    assert take(frozenset({b"b"}), upper_read=True) == ["b"]
