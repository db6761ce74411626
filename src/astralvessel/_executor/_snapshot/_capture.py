"""A turn's workspace into the store, and a snapshot's tree back into a fresh workspace.

Both are file plans (generators of ``FsRequest``, driven by the turn as its
file primitives are), so the sync and async turn share them:

- ``capture``: the file worker lists the workspace (names, kinds, modes,
  sizes, link targets, and each file's stat); the host builds the manifest's
  shape from the listing (a special file, a bad name or a link out of place is
  refused there, before anything is read or written), links each file the
  store holds already (``_reuse``: unchanged since the turn's last capture, or
  still the lower layer's of the snapshot it opened from: the worker marks
  those, or the host from the upper layer's names where it laid the overlay),
  reserves the bytes of the others on the budget (``Budget.reserve``: an
  estimate, so a refusal reads nothing, held until the exact count so two
  captures at once cannot both pass it for the same room), asks the worker
  for the other files' bytes in batches and writes them into the new tree,
  hashing as it writes (``_build``). The manifest's digests are the host's:
  of the bytes it wrote, or its own record of the file it linked. So what a
  sandbox sends can only ever be the snapshot's bytes, never disagree with
  them. The new tree's inodes are then counted exactly in place of the
  reservation (``Budget.hold``: a file another live tree holds counts once),
  and a tree past the budget is refused and goes.
- ``restore``: the manifest's entries, in order, as records the file worker
  makes as the calls' user (so the files belong to the turn's identity, as its
  own would), folders' modes last.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import stat
from collections.abc import Generator, Iterator
from typing import Any

from ...errors import SnapshotError
from ...sandbox._api import FsReply, FsRequest
from ...sandbox.server._fsops import CHUNK_BYTES
from ._build import TreeWriter
from ._manifest import SETID_BITS, Entry, EntryKind, Manifest, show
from ._reuse import Captures, Held, matches, recorded_stat, with_digests
from ._store import Budget, Reservation, Tree, new_folder
from ._value import TurnSnapshot

__all__ = ["capture", "checked_shape", "manifest_of", "restore", "too_many_names"]

Plan = Generator[FsRequest, FsReply, Any]

#: The kinds the worker names that a snapshot refuses, as the error says them.
_REFUSED = {
    "fifo": "a fifo",
    "socket": "a socket",
    "chardev": "a character device",
    "blockdev": "a block device",
    "unknown": "a file of an unknown kind",
}
#: A regular file's digest in the manifest's shape, before the host has the file's own.
_PLACEHOLDER = "0" * 64
#: Records per restore request: each is at most two names of 4 KiB as JSON, within a frame.
_RECORDS_PER_REQUEST = 2000


def _refusal(reply: FsReply, what: str) -> SnapshotError | None:
    if reply.errno is None:
        return None
    return SnapshotError(f"{what}: {reply.message or reply.errno}")


def capture(
    *,
    timeout: float,
    max_bytes: int,
    max_files: int,
    budget: Budget,
    captures: Captures | None = None,
) -> Generator[FsRequest, FsReply, TurnSnapshot]:
    """The plan of ``Turn.snapshot``: list, check, link or read, hash; the snapshot it made.

    ``captures``: the turn's memory of its source and last capture, whose files
    an unchanged file is linked to (None: every file is read).
    """
    reply = yield FsRequest(
        op="pack", timeout=timeout, fields={"phase": "list", "max_files": max_files + 1}
    )
    if reply.errno == "EFBIG":
        raise too_many_names(max_files)
    failed = _refusal(reply, "the workspace cannot be listed")
    if failed is not None:
        raise failed
    try:
        listing = json.loads(reply.data)
    except (ValueError, RecursionError):
        raise SnapshotError("the sandbox's listing of the workspace is not JSON") from None
    shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
    files = {
        _name(item): item for item in listing if item.get("kind") == "file"
    }  # manifest_of checked every item is an object with a name
    if reply.upper_names is not None:  # the host laid the overlay: its reading decides
        mark_lower(files, reply.upper_names if reply.upper_read else None)
    held = captures.reusable(files) if captures is not None else {}
    # The estimate: the bytes of the files to read, reserved until the exact count, so two
    # captures at once cannot both pass it for the same room. A linked file may still count
    # (one no live tree of this budget holds: a loaded snapshot's), which the exact count sees.
    reservation = budget.reserve(_unheld_bytes(shape, held))
    try:
        snapshot = yield from _build(shape, held, timeout, budget, reservation)
    finally:
        budget.cancel(reservation)  # a capture that failed, or was dropped, gives it back
    if captures is not None:
        began = reply.fields.get("now_ns")
        if type(began) is int:
            stats = {name: recorded_stat(item, began) for name, item in files.items()}
            captures.remember(snapshot, {k: v for k, v in stats.items() if v is not None})
    return snapshot


def too_many_names(max_files: int) -> SnapshotError:
    """The refusal of a workspace past ``max_files`` names."""
    return SnapshotError(
        f"the workspace holds more than {max_files} names; a snapshot keeps {max_files}"
    )


def checked_shape(listing: object, *, max_bytes: int, max_files: int) -> Manifest:
    """The manifest's shape of a workspace's listing (``_snapfiles``'s, as JSON values),
    with every check a snapshot makes before it reads a byte: ``manifest_of``'s refusals
    and the turn's bounds. A frozen layer's snapshot (``_freeze``) makes the same."""
    if isinstance(listing, list) and len(listing) > max_files:
        raise too_many_names(max_files)
    shape = manifest_of(listing)
    if shape.total_bytes > max_bytes:
        raise SnapshotError(
            f"the workspace's files hold {shape.total_bytes} bytes (a sparse file counts "
            f"its holes), over the {max_bytes} a snapshot of this turn may hold"
        )
    return shape


def _build(
    shape: Manifest,
    held: dict[bytes, Held],
    timeout: float,
    budget: Budget,
    reservation: Reservation,
) -> Generator[FsRequest, FsReply, TurnSnapshot]:
    """The new tree, filled and counted in place of ``reservation``; removed if it fails."""
    # The folder goes, and the files' bytes go back, when the tree is collected or removed.
    tree = Tree(new_folder() / "tree", budget)
    try:
        writer = TreeWriter(tree.path)
        try:
            yield from _fill(writer, shape, held, timeout)
            writer.finish()
        finally:
            writer.close()
        tree.hold(writer.inodes, reservation)
        return TurnSnapshot(manifest=with_digests(shape, writer.digests), tree=tree)
    except BaseException as exc:
        tree.remove()
        if isinstance(exc, OSError):
            raise SnapshotError(f"the snapshot cannot be written: {exc}") from exc
        raise


def _unheld_bytes(shape: Manifest, held: dict[bytes, Held]) -> int:
    """The bytes of the regular files of ``shape`` that no held file may serve."""
    total = 0
    for entry in shape.entries:
        if entry.kind is EntryKind.FILE:
            found = held.get(entry.name)
            if found is None or not matches(found, entry):
                total += entry.size
    return total


def mark_lower(files: dict[bytes, dict[str, Any]], upper: frozenset[bytes] | None) -> None:
    """Mark ``lower`` each listed file whose name the turn's upper layer does not hold, as
    the host read that layer (Docker as root lays the overlay itself): the server, which
    cannot see it there, marks none, and the host's reading replaces what it sent.
    ``upper`` None (the host could not read the layer whole): no file is marked."""
    for name, item in files.items():
        item["lower"] = upper is not None and name not in upper


def _name(item: dict[str, Any]) -> bytes:
    return str(item.get("name", "")).encode("utf-8", "surrogateescape")


def manifest_of(listing: object) -> Manifest:
    """The manifest's shape from the worker's listing (each file's digest a placeholder, the
    host's own once the file is in the tree); ``SnapshotError`` for what a snapshot cannot keep."""
    if not isinstance(listing, list):
        raise SnapshotError("the sandbox's listing is not a list")
    entries = []
    dropped: list[bytes] = []
    for item in listing:
        if not isinstance(item, dict):
            raise SnapshotError("the sandbox's listing holds an entry that is not an object")
        refused = _REFUSED.get(str(item.get("kind")))
        name = _name(item)
        if refused is not None:
            raise SnapshotError(
                f"{show(name)} is {refused}; a snapshot keeps regular files, folders and links only"
            )
        mode = item.get("mode")
        if isinstance(mode, int) and mode & SETID_BITS:
            dropped.append(name)
            mode &= ~SETID_BITS & 0o7777
        fields = {key: item.get(key) for key in ("name", "kind", "size", "target")}
        digest = _PLACEHOLDER if item.get("kind") == "file" else None
        entries.append(Entry.from_obj(dict(fields, mode=mode, digest=digest)))
    notes = []
    if dropped:
        shown = ", ".join(show(name) for name in sorted(dropped)[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        notes.append(f"set-id bits dropped from {shown}{more}")
    return Manifest.build(entries, notes)


def _fill(writer: TreeWriter, shape: Manifest, held: dict[bytes, Held], timeout: float) -> Plan:
    """Make every entry of ``shape`` in the writer's tree, reading what is not held.

    A batch's files are written by one writer thread while the sandbox reads the
    next batch: a full capture's time goes to the host's file creations and the
    pipe about equally (100 MiB in 10 000 files), so they overlap. One batch at
    a time is written, in order, and a failed write ends the plan.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="capture") as pool:
        pending: concurrent.futures.Future[None] | None = None
        for batch in _pieces(_make_unread(writer, shape, held)):
            asked = [[_text(entry.name), offset, length] for entry, offset, length in batch]
            reply = yield FsRequest(
                op="pack",
                timeout=timeout,
                fields={"phase": "read"},
                data=json.dumps(asked).encode(),
            )
            failed = _refusal(reply, "the workspace's files cannot be read")
            if failed is not None:
                raise failed
            if len(reply.data) != sum(length for _, _, length in batch):
                raise SnapshotError("the sandbox sent more or fewer bytes than its files hold")
            if pending is not None:
                pending.result()
            pending = pool.submit(_write_batch, writer, batch, reply.data)
        if pending is not None:
            pending.result()
    for entry in shape.entries:  # each hard link once its file is in
        if entry.kind is EntryKind.HARDLINK:
            writer.hard_link(entry)


def _write_batch(writer: TreeWriter, batch: list[tuple[Entry, int, int]], data: bytes) -> None:
    view = memoryview(data)
    at = 0
    for entry, offset, length in batch:
        writer.piece(entry, offset, view[at : at + length])
        at += length


def _make_unread(writer: TreeWriter, shape: Manifest, held: dict[bytes, Held]) -> list[Entry]:
    """Make the folders, symlinks, held and empty files; the files left to read."""
    wanted: list[Entry] = []
    for entry in shape.entries:
        kind = entry.kind
        if kind is EntryKind.DIR:
            writer.folder(entry)
        elif kind is EntryKind.SYMLINK:
            writer.symlink(entry)
        elif kind is EntryKind.FILE:
            found = held.get(entry.name)
            if found is not None and writer.link_held(entry, found):
                continue
            if entry.size:
                wanted.append(entry)
            else:
                writer.empty(entry)
    return wanted


def _pieces(files: list[Entry]) -> Iterator[list[tuple[Entry, int, int]]]:
    """The files' bytes as read batches of at most ``CHUNK_BYTES`` each."""
    batch: list[tuple[Entry, int, int]] = []
    room = CHUNK_BYTES
    for entry in files:
        offset = 0
        while offset < entry.size:
            length = min(entry.size - offset, room)
            batch.append((entry, offset, length))
            offset += length
            room -= length
            if not room:
                yield batch
                batch, room = [], CHUNK_BYTES
    if batch:
        yield batch


def _text(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def restore(snapshot: TurnSnapshot, *, timeout: float) -> Plan:
    """The plan that makes a snapshot's files in a fresh workspace."""
    records: list[list[Any]] = []
    chunks: list[bytes] = []
    size = 0
    base = os.fsencode(snapshot.path)
    for record, data in _records(snapshot.manifest, base):
        records.append(record)
        chunks.append(data)
        size += len(data)
        if size >= CHUNK_BYTES or len(records) >= _RECORDS_PER_REQUEST:
            yield from _send(records, chunks, timeout)
            records, chunks, size = [], [], 0
    folders = [entry for entry in snapshot.manifest.entries if entry.kind is EntryKind.DIR]
    for entry in reversed(folders):  # deepest first: a folder without write bits comes last
        records.append(["mode", _text(entry.name), entry.mode, None, 0, 0, True])
        chunks.append(b"")
        if len(records) >= _RECORDS_PER_REQUEST:
            yield from _send(records, chunks, timeout)
            records, chunks = [], []
    if records:
        yield from _send(records, chunks, timeout)


def _records(manifest: Manifest, base: bytes) -> Iterator[tuple[list[Any], bytes]]:
    for entry in manifest.entries:
        name = _text(entry.name)
        kind = entry.kind
        if kind is EntryKind.FILE:
            yield from _file_records(entry, base)
        elif kind is EntryKind.DIR:
            yield ["dir", name, entry.mode, None, 0, 0, True], b""
        else:  # a link: the manifest gives every link a target
            yield [kind.value, name, entry.mode, _text(entry.target or b""), 0, 0, True], b""


def _file_records(entry: Entry, base: bytes) -> Iterator[tuple[list[Any], bytes]]:
    name = _text(entry.name)
    if not entry.size:
        yield ["file", name, entry.mode, None, 0, 0, True], b""
        return
    fd = os.open(base + b"/" + entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"the snapshot's tree changed on the host at {show(entry.name)}")
        offset = 0
        while offset < entry.size:
            data = os.pread(fd, min(CHUNK_BYTES, entry.size - offset), offset)
            if not data:
                raise SnapshotError(
                    f"the snapshot's tree changed on the host at {show(entry.name)}"
                )
            final = offset + len(data) == entry.size
            yield ["file", name, entry.mode, None, offset, len(data), final], data
            offset += len(data)
    finally:
        os.close(fd)


def _send(records: list[list[Any]], chunks: list[bytes], timeout: float) -> Plan:
    index = json.dumps(records).encode()
    reply = yield FsRequest(
        op="unpack",
        timeout=timeout,
        fields={"index_bytes": len(index)},
        data=index + b"".join(chunks),
    )
    failed = _refusal(reply, "the snapshot cannot be restored in this turn")
    if failed is not None:
        raise failed
