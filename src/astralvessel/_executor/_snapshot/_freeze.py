"""A snapshot of a frozen layer: a sandbox's workspace made read-only in place, held by fd.

A capture copies the workspace into the store (1-2 s and its whole size for
100 MiB). A frozen layer copies nothing: the sandbox's server makes its
workspace tmpfs read-only where it is and hands the host a detached mount of
it (``open_tree(OPEN_TREE_CLONE)``'s descriptor), which ``Tree.frozen`` holds.
Its snapshot is made here, on the host, with exactly the checks a capture
makes: the layer is listed by the file worker's own code (``_snapfiles.pack``,
stdlib-only, run in this process on the layer's descriptor), the listing's
shape checked by ``_capture.checked_shape`` (``manifest_of``'s refusals of a
special file, a bad name, a link out of place; the turn's bounds), the layer's
bytes counted on the budget (``Budget.hold``: once per inode, for as long as a
snapshot refers to the layer) before any file is read, and each file's digest
the host's own, of the bytes it read. They cannot change under it: the layer
is refused unless it is read-only (and the listing is the host's, not a
sandbox's reply).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

import attrs

from ...errors import SnapshotError
from ...sandbox._api import SandboxSession
from ...sandbox._frozen import freeze
from ...sandbox._policy import OUTBOX_DIR, WORKSPACE_DIR
from ...sandbox.server import _snapfiles
from ._capture import checked_shape, too_many_names
from ._manifest import EntryKind, Manifest
from ._mechanism import layer_backend
from ._reuse import with_digests
from ._store import Budget, Inodes, Tree
from ._tree import hash_file, open_regular
from ._value import TurnSnapshot

__all__ = ["freeze_snapshot", "freezes_here", "snapshot_frozen"]

#: The server's outbox, as a name in the workspace: a capture leaves it out, and so does this.
OUTBOX_NAME = str(OUTBOX_DIR.relative_to(WORKSPACE_DIR))


@attrs.frozen
class _Layer:
    """What ``_snapfiles.pack`` reads of a session's state (``raw``), for a frozen layer."""

    workspace: str
    outbox: str
    upper: int = -1  # no upper layer: no file is marked the lower layer's


def snapshot_frozen(
    fd: int,
    *,
    budget: Budget | None,
    max_bytes: int,
    max_files: int,
    outbox: str = OUTBOX_NAME,
) -> TurnSnapshot:
    """The snapshot of the frozen layer whose detached mount ``fd`` is.

    The snapshot's tree owns ``fd`` from the call on: it is closed when the last
    snapshot referring to the layer goes, or here when the layer is refused
    (``SnapshotError``: not a read-only folder, or what a capture refuses).
    ``outbox``: the server's outbox folder in the layer, left out.
    """
    tree = Tree.frozen(fd, budget)
    try:
        device = _checked_layer(fd)
        listing = _listing(tree.path.as_posix(), outbox, max_files)
        shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
        tree.hold(_inodes(listing, device))  # exact at once: nothing is read before it
        digests = _digests(os.fsencode(tree.path), shape)
        return TurnSnapshot(manifest=with_digests(shape, digests), tree=tree)
    except BaseException as exc:
        tree.remove()
        if isinstance(exc, OSError):
            raise SnapshotError(f"the frozen workspace cannot be read: {exc}") from exc
        raise


def _checked_layer(fd: int) -> int:
    """The layer's device, once it is known a read-only folder (its bytes cannot change)."""
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise SnapshotError("the frozen workspace is not a folder")
    if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
        raise SnapshotError("the frozen workspace is not read-only: its files could change")
    return info.st_dev


def _listing(root: str, outbox: str, max_files: int) -> Any:
    """The file worker's listing of the layer, as a capture's reply holds it (JSON values).

    ``root/.``: the descriptor's path is a link (``/proc/self/fd/N``), which the
    worker's ``O_NOFOLLOW`` would refuse as the last component; one more makes it
    a folder on the way, and opens the mount's root.
    """
    workspace = root + "/."
    layer = _Layer(workspace=workspace, outbox=f"{workspace}/{outbox}" if outbox else "")
    try:
        _, data = _snapfiles.pack({"phase": "list", "max_files": max_files + 1}, b"", layer)
    except _snapfiles.Refused as exc:
        if exc.code == errno.EFBIG:
            raise too_many_names(max_files) from None
        raise SnapshotError(f"the frozen workspace cannot be listed: {exc}") from None
    return json.loads(data)


def _inodes(listing: Any, device: int) -> Inodes:
    """Each regular file's inode in the layer and its bytes, as the budget counts them
    (a hard link's other names are its file's: the listing names the file once)."""
    return {
        (device, int(item["stat"][0])): int(item["size"])
        for item in listing
        if item.get("kind") == "file"
    }


def _digests(base: bytes, shape: Manifest) -> dict[bytes, str]:
    """Each regular file's sha256, read from the layer."""
    digests: dict[bytes, str] = {}
    for entry in shape.entries:
        if entry.kind is EntryKind.FILE:
            fd = open_regular(base + b"/" + entry.name, entry.name, replaced="is not a file")
            try:
                digests[entry.name] = hash_file(fd, entry.size, entry.name)
            finally:
                os.close(fd)
    return digests


def freezes_here(backend: str) -> bool:
    """Whether a fork of ``backend``'s turn asks its sandbox to freeze the workspace.

    As root on bubblewrap and nsjail, whose launchers pass the layer's descriptor to
    the forks (``_mechanism.layer_backend``), which lay their overlays on it. Not as
    an ordinary user: a fork's overlay over a layer of another user namespace is
    refused (EPERM), so each fork would copy the whole layer where a store tree
    serves them all copy-on-write. Not on Docker: its host does not take a layer.
    """
    return os.geteuid() == 0 and layer_backend(backend)


def freeze_snapshot(
    session: SandboxSession, *, upper_bytes: int, budget: Budget, max_bytes: int, max_files: int
) -> TurnSnapshot | None:
    """The turn's files frozen in place (``sandbox._frozen.freeze``), as a snapshot, or None
    where the sandbox makes no freeze (the caller captures instead: nothing changed).

    Refused: while a call or detached process runs or a file is open for writing
    (``EBUSY``), over a workspace that is no tmpfs of its own (``EOPNOTSUPP``: opened
    from a snapshot, frozen already), on a kernel without the steps (Linux 6.8 lays an
    overlay from descriptors). Raises ``SnapshotError`` for a layer a capture refuses.
    """
    try:
        fd = freeze(session, upper_bytes)
    except OSError:
        return None  # as it was, or frozen with the clone lost: a capture reads the overlay
    return snapshot_frozen(fd, budget=budget, max_bytes=max_bytes, max_files=max_files)
