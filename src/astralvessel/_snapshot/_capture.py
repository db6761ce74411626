"""A turn's workspace into the store, and a snapshot's tree back into a fresh workspace.

Both are file plans (generators of ``FsRequest``, driven by the turn as its
file primitives are), so the sync and async turn share them:

- ``capture``: the file worker lists the workspace (the manifest's entries,
  digests included) and reads the files in batches; the host builds the
  manifest from the listing (a special file, a bad name or a link out of place
  is refused there), writes the saved form from the replies and hands it to
  ``extract_archive``, the same checked reader a loaded file goes through. So
  what a sandbox sends is checked exactly as a file from elsewhere: a name, a
  size or a byte that disagrees with the manifest is refused before any file
  of the tree is written.
- ``restore``: the manifest's entries, in order, as records the file worker
  makes as the calls' user (so the files belong to the turn's identity, as its
  own would), folders' modes last.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Generator, Iterator
from typing import Any, BinaryIO

from ..errors import SnapshotError
from ..sandbox._api import FsReply, FsRequest
from ..sandbox.server._fsops import CHUNK_BYTES
from ._archive import MANIFEST_MEMBER, _member_link, _member_name, extract_archive
from ._manifest import SETID_BITS, Entry, EntryKind, Manifest, show
from ._store import Budget, Tree, new_folder
from ._tar import BLOCK, TYPEFLAGS, member_header, pad
from ._value import TurnSnapshot

__all__ = ["capture", "restore"]

Plan = Generator[FsRequest, FsReply, Any]

#: The kinds the worker names that a snapshot refuses, as the error says them.
_REFUSED = {
    "fifo": "a fifo",
    "socket": "a socket",
    "chardev": "a character device",
    "blockdev": "a block device",
    "unknown": "a file of an unknown kind",
}
#: Records per restore request: each is at most two names of 4 KiB as JSON, within a frame.
_RECORDS_PER_REQUEST = 2000


def _refusal(reply: FsReply, what: str) -> SnapshotError | None:
    if reply.errno is None:
        return None
    return SnapshotError(f"{what}: {reply.message or reply.errno}")


def capture(
    *, timeout: float, max_bytes: int, max_files: int, budget: Budget
) -> Generator[FsRequest, FsReply, TurnSnapshot]:
    """The plan of ``Turn.snapshot``: list, check, read, extract; the snapshot it made."""
    reply = yield FsRequest(
        op="pack", timeout=timeout, fields={"phase": "list", "max_files": max_files + 1}
    )
    if reply.errno == "EFBIG":
        raise SnapshotError(
            f"the workspace holds more than {max_files} names; a snapshot keeps {max_files}"
        )
    failed = _refusal(reply, "the workspace cannot be listed")
    if failed is not None:
        raise failed
    try:
        listing = json.loads(reply.data)
    except (ValueError, RecursionError):
        raise SnapshotError("the sandbox's listing of the workspace is not JSON") from None
    if isinstance(listing, list) and len(listing) > max_files:
        raise SnapshotError(
            f"the workspace holds more than {max_files} names; a snapshot keeps {max_files}"
        )
    manifest = manifest_of(listing)
    if manifest.total_bytes > max_bytes:
        raise SnapshotError(
            f"the workspace's files hold {manifest.total_bytes} bytes (a sparse file counts "
            f"its holes), over the {max_bytes} a snapshot of this turn may hold"
        )
    budget.take(manifest.total_bytes)
    # The tree gives its bytes back, and its folder (the spool with it) goes, when it is
    # collected: at once if anything below raises.
    try:
        folder = new_folder()
    except BaseException:
        budget.give_back(manifest.total_bytes)
        raise
    tree = Tree(folder / "tree", manifest.total_bytes, budget)
    spool_path = tree.path.parent / "capture.tar"
    with open(spool_path, "w+b") as spool:
        yield from _write_saved_form(manifest, spool, timeout)
        spool.seek(0)
        extracted = extract_archive(spool, tree.path, max_bytes=max_bytes, max_files=max_files)
    spool_path.unlink()
    return TurnSnapshot(manifest=extracted, tree=tree)


def manifest_of(listing: object) -> Manifest:
    """The manifest of the worker's listing; ``SnapshotError`` for what a snapshot cannot keep."""
    if not isinstance(listing, list):
        raise SnapshotError("the sandbox's listing is not a list")
    entries = []
    dropped: list[bytes] = []
    for item in listing:
        if not isinstance(item, dict):
            raise SnapshotError("the sandbox's listing holds an entry that is not an object")
        refused = _REFUSED.get(str(item.get("kind")))
        name = str(item.get("name", "")).encode("utf-8", "surrogateescape")
        if refused is not None:
            raise SnapshotError(
                f"{show(name)} is {refused}; a snapshot keeps regular files, folders and links only"
            )
        mode = item.get("mode")
        if isinstance(mode, int) and mode & SETID_BITS:
            dropped.append(name)
            mode &= ~SETID_BITS & 0o7777
        entries.append(Entry.from_obj(dict(item, mode=mode)))
    notes = []
    if dropped:
        shown = ", ".join(show(name) for name in sorted(dropped)[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        notes.append(f"set-id bits dropped from {shown}{more}")
    return Manifest.build(entries, notes)


def _pieces(manifest: Manifest) -> Iterator[list[tuple[Entry, int, int]]]:
    """The regular files' bytes as read batches of at most ``CHUNK_BYTES`` each."""
    batch: list[tuple[Entry, int, int]] = []
    room = CHUNK_BYTES
    for entry in manifest.entries:
        offset = 0
        while entry.kind is EntryKind.FILE and offset < entry.size:
            length = min(entry.size - offset, room)
            batch.append((entry, offset, length))
            offset += length
            room -= length
            if not room:
                yield batch
                batch, room = [], CHUNK_BYTES
    if batch:
        yield batch


def _write_saved_form(manifest: Manifest, out: BinaryIO, timeout: float) -> Plan:
    """Write the saved form of the workspace the manifest lists, its bytes read from the worker."""
    data = manifest.to_json()
    out.write(member_header(MANIFEST_MEMBER, b"0", 0o644, len(data)) + data + pad(len(data)))
    entries = iter(manifest.entries)

    def headers_through(last: Entry | None) -> None:
        for entry in entries:
            out.write(
                member_header(
                    _member_name(entry),
                    TYPEFLAGS[entry.kind],
                    entry.mode,
                    entry.size,
                    _member_link(entry),
                )
            )
            if entry is last:
                return

    for batch in _pieces(manifest):
        wanted = [[_text(entry.name), offset, length] for entry, offset, length in batch]
        reply = yield FsRequest(
            op="pack", timeout=timeout, fields={"phase": "read"}, data=json.dumps(wanted).encode()
        )
        failed = _refusal(reply, "the workspace's files cannot be read")
        if failed is not None:
            raise failed
        if len(reply.data) != sum(length for _, _, length in batch):
            raise SnapshotError("the sandbox sent more or fewer bytes than its files hold")
        at = 0
        for entry, offset, length in batch:
            if offset == 0:
                headers_through(entry)
            out.write(reply.data[at : at + length])
            at += length
            if offset + length == entry.size:
                out.write(pad(entry.size))
    headers_through(None)
    out.write(b"\0" * (2 * BLOCK))


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
