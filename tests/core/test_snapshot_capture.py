"""The host's side of a capture: a sandbox's listing is untrusted, and checked before anything.

A sandbox whose server or file worker a call subverted can send any listing
and any bytes; these tests play that sandbox against the capture plan, which
drives it as the turn does, with no sandbox at all (the conformance suite runs
the real ones).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pickle
from collections.abc import Generator
from typing import Any

import pytest

from astralvessel import SnapshotError, TurnSnapshot
from astralvessel._executor._snapshot._capture import capture, manifest_of, restore
from astralvessel._executor._snapshot._reaper import drain
from astralvessel._executor._snapshot._store import Budget, store_root
from astralvessel.sandbox import FsReply, FsRequest


def _file(name: str, data: bytes, mode: int = 0o644) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "file",
        "mode": mode,
        "size": len(data),
        "target": None,
        "digest": hashlib.sha256(data).hexdigest(),
    }


def _drive(
    plan: Generator[FsRequest, FsReply, Any], listing: list[dict[str, Any]], data: bytes
) -> Any:
    """Answer the plan as a sandbox would: ``listing`` first, then ``data`` for every read."""
    request = next(plan)
    reply = FsReply(fields={"count": len(listing)}, data=json.dumps(listing).encode())
    sent = 0
    while True:
        try:
            request = plan.send(reply)
        except StopIteration as done:
            return done.value
        wanted = json.loads(request.data)
        length = sum(piece[2] for piece in wanted)
        reply = FsReply(data=data[sent : sent + length])
        sent += length


def _capture(budget: Budget | None = None) -> Generator[FsRequest, FsReply, TurnSnapshot]:
    return capture(timeout=5.0, max_bytes=1 << 20, max_files=100, budget=budget or Budget(1 << 20))


def test_an_honest_listing_becomes_a_snapshot():
    """The listing and the bytes the sandbox sends become the tree, checked by the reader."""
    listing = [
        {"name": "d", "kind": "dir", "mode": 0o755, "size": 0, "target": None, "digest": None},
        _file("d/a", b"alpha"),
        {"name": "l", "kind": "symlink", "mode": 0o777, "size": 0, "target": "d/a", "digest": None},
    ]
    snapshot = _drive(_capture(), listing, b"alpha")
    assert (snapshot.path / "d" / "a").read_bytes() == b"alpha"
    assert snapshot.file_count == 3


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "../up", "kind": "dir"}, "'..' component"),
        ({"name": "/etc", "kind": "dir"}, "absolute name"),
        ({"name": "p", "kind": "fifo"}, "'p' is a fifo"),
        ({"name": "s", "kind": "socket"}, "'s' is a socket"),
        ({"name": "c", "kind": "chardev"}, "'c' is a character device"),
        ({"name": "x/y", "kind": "dir"}, "not under a folder listed before it"),
        ({"name": "h", "kind": "hardlink", "target": "/etc/shadow"}, "hard link to an absolute"),
    ],
)
def test_a_hostile_listing_is_refused_before_any_read(entry: dict[str, Any], problem: str):
    """Names out of the tree, special files and links out are refused by name, nothing read."""
    listing = [{"mode": 0o755, "size": 0, "target": None, "digest": None, **entry}]
    plan = _capture()
    next(plan)
    with pytest.raises(SnapshotError, match=problem):
        plan.send(FsReply(data=json.dumps(listing).encode()))


def test_set_id_bits_are_dropped_with_a_note():
    """A listing's set-uid and set-gid bits never reach the manifest; a note says so."""
    manifest = manifest_of([_file("t", b"", 0o6755)])
    assert manifest.entries[0].mode == 0o755
    assert manifest.notes == ("set-id bits dropped from 't'",)


def test_the_digests_are_the_hosts_own():
    """Whatever digest a listing claims, the manifest holds the hash of the bytes written."""
    snapshot = _drive(_capture(), [_file("f", b"honest")], b"forged")
    assert (snapshot.path / "f").read_bytes() == b"forged"
    assert snapshot.manifest.entries[0].digest == hashlib.sha256(b"forged").hexdigest()


def test_a_short_reply_is_refused():
    """A reply shorter than the files it was asked for refuses the snapshot."""
    plan = _capture()
    next(plan)
    plan.send(FsReply(data=json.dumps([_file("f", b"twelve bytes")]).encode()))
    with pytest.raises(SnapshotError, match="more or fewer bytes"):
        plan.send(FsReply(data=b"short"))


def test_a_listing_past_the_budget_reads_nothing():
    """A listing whose sizes pass the budget is refused before a byte is read or kept."""
    budget = Budget(4)
    plan = _capture(budget)
    next(plan)
    with pytest.raises(SnapshotError, match="budget"):
        plan.send(FsReply(data=json.dumps([_file("f", b"too long")]).encode()))
    assert budget.used_bytes == 0


def test_a_refused_capture_leaves_nothing_and_gives_its_bytes_back():
    """A capture refused after its tree was begun leaves no folder and holds no bytes."""
    budget = Budget(1 << 20)
    before = set(os.listdir(store_root()))
    with pytest.raises(SnapshotError, match="more or fewer bytes"):
        _drive(_capture(budget), [_file("f", b"honest")], b"short")
    gc.collect()
    assert drain(10)
    assert budget.used_bytes == 0
    assert set(os.listdir(store_root())) <= before


def test_restore_records_follow_the_manifest():
    """A restore sends folders, files in pieces, links, then folders' modes deepest first."""
    listing = [
        {"name": "d", "kind": "dir", "mode": 0o555, "size": 0, "target": None, "digest": None},
        {"name": "d/e", "kind": "dir", "mode": 0o700, "size": 0, "target": None, "digest": None},
        _file("d/e/f", b"bytes"),
        {
            "name": "d/h",
            "kind": "hardlink",
            "mode": 0o644,
            "size": 0,
            "target": "d/e/f",
            "digest": None,
        },
    ]
    snapshot = _drive(_capture(), listing, b"bytes")
    plan = restore(snapshot, timeout=5.0)
    request = next(plan)
    index = request.fields["index_bytes"]
    records = json.loads(request.data[:index])
    assert [record[:2] for record in records] == [
        ["dir", "d"],
        ["dir", "d/e"],
        ["file", "d/e/f"],
        ["hardlink", "d/h"],
        ["mode", "d/e"],
        ["mode", "d"],
    ]
    assert request.data[index:] == b"bytes"
    with pytest.raises(StopIteration):
        plan.send(FsReply(fields={"count": len(records)}))


def test_a_snapshot_pickles_as_its_saved_form():
    """Pickled (as Ray's object store does), a snapshot arrives as an equal one, checked anew."""
    snapshot = _drive(_capture(), [_file("f", b"travels")], b"travels")
    arrived = pickle.loads(pickle.dumps(snapshot))  # noqa: S301 - our own bytes
    assert arrived == snapshot
    assert arrived.path != snapshot.path
    assert (arrived.path / "f").read_bytes() == b"travels"


def test_a_forked_child_leaves_the_parents_trees():
    """A child process forked from the host exits without removing its parent's snapshot trees."""
    snapshot = _drive(_capture(), [_file("f", b"kept")], b"kept")
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the snapshot and exits as a host would
        del snapshot
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    assert (snapshot.path / "f").read_bytes() == b"kept"


@pytest.mark.parametrize(
    ("listing", "problem"),
    [
        (b"[" * 100_000, "not JSON"),
        (b"{}", "not a list"),
        (json.dumps([1]).encode(), "not an object"),
        (json.dumps([_file(str(i), b"") for i in range(101)]).encode(), "more than 100 names"),
    ],
)
def test_a_listing_that_is_not_one_is_refused(listing: bytes, problem: str):
    """Bytes that are no listing, or one past the bound, refuse the snapshot with its reason."""
    plan = _capture()
    next(plan)
    with pytest.raises(SnapshotError, match=problem):
        plan.send(FsReply(data=listing))
