"""A snapshot of a frozen layer: a sandbox's workspace made read-only in place, staged.

A capture copies the workspace into the store (1-2 s and its whole size for
100 MiB). A frozen layer copies nothing: the sandbox's server makes its
workspace tmpfs read-only where it is and hands the host a detached mount of
it (``open_tree(OPEN_TREE_CLONE)``'s descriptor), which ``Tree.frozen`` moves
onto a folder of the store: from then on a path, which forks bind as any tree
(a descriptor would not do: only the mount namespace a detached mount was
cloned in may clone it again, as a fork's server does for its lower layer).
Its snapshot is made here, on the host, with exactly the checks a capture
makes: the layer is listed by the file worker's own code (``_snapfiles.pack``,
stdlib-only, run in this process on the staged path), the listing's
shape checked by ``_capture.checked_shape`` (``manifest_of``'s refusals of a
special file, a bad name, a link out of place; the turn's bounds), the layer's
bytes counted on the budget (``Budget.hold``: once per inode, for as long as a
snapshot refers to the layer) before any file is read, and each file's digest
the host's own, of the bytes it read. They cannot change under it: the layer
is refused unless it is read-only (and the listing is the host's, not a
sandbox's reply: where the host cannot read the layer's files, an ordinary user's
Docker host, its own reader container's, ``docker._reader``, checked alike).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs

from ..._ground._log import SNAPSHOTS, WARNING, event
from ...errors import SnapshotError
from ...sandbox._api import SandboxSession
from ...sandbox._frozen import LayerLost, freeze, freeze_fork_layer
from ...sandbox._policy import OUTBOX_DIR, WORKSPACE_DIR
from ...sandbox.server import _snapfiles
from ...sandbox.server._messages import MAX_LAYERS
from ._archive import checked_pieces
from ._build import TreeWriter
from ._capture import checked_shape, too_many_names
from ._heldmerge import merged_view
from ._manifest import Entry, EntryKind, Manifest
from ._reuse import with_digests
from ._store import Budget, Inodes, Tree, new_folder
from ._tree import hash_file, open_regular
from ._value import TurnSnapshot

__all__ = [
    "Unstaged",
    "freeze_snapshot",
    "freezes_here",
    "snapshot_frozen",
    "snapshot_stacked",
    "stacks_on",
    "store_copy",
]

#: The backends whose sandbox the host can freeze: a local server process it asks, or
#: Docker's server, in whose mount namespace the host mounts (not ``docker-exec``: no server).
#: Where any user's host freezes: Docker's as root by its own mounts, as an ordinary user
#: where the direct channel serves (``_PASSES``: the server passes the held layer on it).
_FREEZES = frozenset({"bubblewrap", "nsjail", "docker"})
_PASSES = frozenset({"docker"})

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
    read_layer: Callable[[int], AbstractContextManager[Any]] | None = None,
) -> TurnSnapshot:
    """The snapshot of the frozen layer whose detached mount ``fd`` is.

    ``fd`` is the snapshot's or closed here: once checked, as root the mount is staged
    in the store (``Tree.frozen``: moved onto a folder there, a path from then on, and
    ``fd`` closed), unmounted when the last snapshot referring to the layer goes; as
    an ordinary user, who cannot mount, the tree keeps ``fd`` (``Tree.held_layer``: read
    through ``/proc/self/fd``, passed to forks' servers), closed when the last snapshot
    goes. Either is undone here when the layer is refused (``SnapshotError``: not a
    read-only folder, or what a capture refuses). ``outbox``: the server's outbox
    folder in the layer, left out. ``read_layer``: where the host cannot read the
    layer's files (an ordinary user's Docker host: they are the turn's uid's), the
    reader that lists and hashes them for it (``docker._reader``): its listing passes
    the same checks, and its failure to serve raises ``Unstaged`` (the caller copies).
    """
    try:
        device = _checked_layer(fd)
    except BaseException:
        os.close(fd)
        raise
    if os.geteuid() != 0:
        tree = Tree.held_layer(fd, budget)  # no mount of the host's: read by its descriptor
    else:
        try:
            tree = Tree.frozen(fd, budget)
        except OSError as exc:
            raise Unstaged(f"the frozen workspace cannot be staged: {exc}") from exc
    try:
        if read_layer is None:
            listing = _listing(tree.path.as_posix(), outbox, max_files)
            shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
            tree.hold(_inodes(listing, device))  # exact at once: nothing is read before it
            digests = _digests(os.fsencode(tree.path), shape)
        else:
            with read_layer(fd) as layer:
                listing = _read_listing(layer, outbox, max_files)
                shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
                tree.hold(_inodes(listing, device))
                digests = _read_digests(layer, shape)
            tree.reader = read_layer  # its saves and store copy read through it too
        return TurnSnapshot(manifest=with_digests(shape, digests), tree=tree)
    except BaseException as exc:
        tree.remove()
        if isinstance(exc, ConnectionError):  # the reader failed, not the layer: a copy
            raise Unstaged(f"the frozen workspace's reader failed: {exc}") from exc
        if isinstance(exc, OSError):
            raise SnapshotError(f"the frozen workspace cannot be read: {exc}") from exc
        raise


def snapshot_stacked(
    fd: int,
    below: TurnSnapshot,
    *,
    userxattr: bool,
    budget: Budget | None,
    max_bytes: int,
    max_files: int,
    outbox: str = OUTBOX_NAME,
    reader: Reader | None = None,
) -> TurnSnapshot:
    """The snapshot of a fork's own frozen upper layer (``fd``, as ``snapshot_frozen``
    takes) stacked over the layers ``below`` lies on (the snapshot the fork opened from):
    a stack ``[this layer, *below's]``, flattened, whose merged view (``Tree.stacked``,
    a read-only overlay mounted in the store) is the snapshot's ``path``, listed, checked
    and hashed there exactly as a frozen layer's files are. Only this layer's own files
    are counted on the budget (the layers below are counted already, and kept here).

    ``fd`` is the snapshot's or closed here; ``Unstaged`` where the layer cannot be
    staged or the stack mounted (the caller captures: the fork writes on above the layer
    either way), ``SnapshotError`` for what a capture refuses.

    As an ordinary user, who cannot mount, the layer is held (``Tree.held_layer``) over
    ``below``'s held layers, and the merged view is a detached overlay of them all made
    in a user namespace of its own (``_heldmerge``), held too (``Tree.held_stacked``).
    ``reader``: where the host cannot read the layers' files (an ordinary user's Docker
    host), what lists, merges and hashes them for it (``docker._reader``): the merged view
    is its overlay, held alike, and its listings pass the same checks.
    """
    if reader is not None:
        return _read_stacked(
            fd,
            below,
            reader,
            userxattr=userxattr,
            budget=budget,
            max_bytes=max_bytes,
            max_files=max_files,
            outbox=outbox,
        )
    held = os.geteuid() != 0
    try:
        device = _checked_layer(fd)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise Unstaged(f"the fork's frozen layer cannot be read: {exc}") from exc
        raise
    try:
        staged = Tree.held_layer(fd, budget) if held else Tree.frozen(fd, budget)
    except OSError as exc:
        raise Unstaged(f"the fork's frozen layer cannot be staged: {exc}") from exc
    try:
        own = _listing(staged.path.as_posix(), "", max_files)
        staged.hold(_inodes(own, device))  # its bytes, before any is read
        if held:
            tree = _held_stacked(staged, below, budget, userxattr=userxattr)
        else:
            tree = Tree.stacked((staged, *below.stack), budget, userxattr=userxattr)
    except OSError as exc:
        staged.remove()
        raise Unstaged(f"the fork's layers cannot be stacked: {exc}") from exc
    except BaseException:
        staged.remove()
        raise
    try:
        listing = _listing(tree.path.as_posix(), outbox, max_files)
        shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
        digests = _digests(os.fsencode(tree.path), shape, _below_digests(below, own))
        return TurnSnapshot(manifest=with_digests(shape, digests), tree=tree)
    except BaseException as exc:
        tree.remove()
        if isinstance(exc, OSError):
            raise SnapshotError(f"the fork's frozen layers cannot be read: {exc}") from exc
        raise


@attrs.frozen
class Reader:
    """What reads an ordinary user's Docker layers for the host (``docker._reader``): the
    session's ``read_layer`` (a layer's listing and digests) and ``merge_layers`` (a
    stack's merged view)."""

    read: Callable[[int], AbstractContextManager[Any]]
    merge: Callable[[tuple[int, ...], bool], int]


def _read_stacked(
    fd: int,
    below: TurnSnapshot,
    reader: Reader,
    *,
    userxattr: bool,
    budget: Budget | None,
    max_bytes: int,
    max_files: int,
    outbox: str,
) -> TurnSnapshot:
    """``snapshot_stacked``, each read the reader's: the fork's own layer listed (its bytes
    held before any is read), the stack merged, listed and hashed (only files the fork's
    layer holds a name of: the others keep ``below``'s digests)."""
    try:
        device = _checked_layer(fd)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise Unstaged(f"the fork's frozen layer cannot be read: {exc}") from exc
        raise
    staged = Tree.held_layer(fd, budget)
    try:
        with reader.read(fd) as layer:
            own = _read_listing(layer, "", max_files)
        staged.hold(_inodes(own, device))  # its bytes, before any is read
        layers = (staged, *below.held_stack)
        view = reader.merge(tuple(int(t.held) for t in layers if t.held is not None), userxattr)
        tree = Tree.held_stacked(view, layers, budget)
        tree.reader = reader.read  # its saves and store copy read through it too
    except BaseException as exc:
        staged.remove()
        if isinstance(exc, OSError):  # the reader's refusal or failure: the fork captures
            raise Unstaged(f"the fork's layers cannot be stacked: {exc}") from exc
        raise
    try:
        with reader.read(view) as merged:
            listing = _read_listing(merged, outbox, max_files)
            shape = checked_shape(listing, max_bytes=max_bytes, max_files=max_files)
            digests = _read_digests(merged, shape, _below_digests(below, own))
        return TurnSnapshot(manifest=with_digests(shape, digests), tree=tree)
    except BaseException as exc:
        tree.remove()
        if isinstance(exc, ConnectionError):  # the reader failed, not the layers: a copy
            raise Unstaged(f"the fork's layers' reader failed: {exc}") from exc
        if isinstance(exc, OSError):
            raise SnapshotError(f"the fork's frozen layers cannot be read: {exc}") from exc
        raise


def _held_stacked(
    top: Tree, below: TurnSnapshot, budget: Budget | None, *, userxattr: bool
) -> Tree:
    """The held stack ``[top, *below's held layers]`` and its merged view (``_heldmerge``)."""
    layers = (top, *below.held_stack)
    if not userxattr:  # a namespace of the host user's own reads user.* attributes only
        raise OSError(errno.EOPNOTSUPP, "the fork's layer holds trusted.* overlay attributes")
    fd = merged_view(tuple(int(layer.held) for layer in layers if layer.held is not None))
    return Tree.held_stacked(fd, layers, budget)


def _below_digests(below: TurnSnapshot, own: Any) -> dict[bytes, Entry]:
    """The files of ``below`` the fork's own layer (``own``, its listing) holds no name of:
    the stack shows each as ``below`` did (the layers are read-only, and a name the top
    layer does not hold, under no opaque folder of it, is the layers' below), so their
    digests are the host's own record, not read again."""
    mine = {str(item.get("name", "")).encode("utf-8", "surrogateescape") for item in own}
    return {
        entry.name: entry
        for entry in below.manifest.entries
        if entry.kind is EntryKind.FILE and entry.name not in mine
    }


def stacks_on(snapshot: TurnSnapshot | None) -> bool:
    """Whether a fork opened from ``snapshot`` freezes its own layer and stacks it over
    ``snapshot``'s (``snapshot_stacked``): root's staged frozen layers, short of
    ``MAX_LAYERS`` (a deeper fork of a fork captures, as every fork of a fork did before;
    an ordinary user's are held layers, ``held_stack``, whose merged view a namespace of
    its own mounts, ``_heldmerge``, or on Docker the reader, ``Reader``)."""
    if snapshot is None:
        return False
    layers = snapshot.stack if os.geteuid() == 0 else snapshot.held_stack
    return 0 < len(layers) < MAX_LAYERS


class Unstaged(SnapshotError):
    """The layer could not be moved into the store (not root, a kernel's refusal)."""


def _checked_layer(fd: int) -> int:
    """The layer's device, once it is known a read-only folder (its bytes cannot change)."""
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise SnapshotError("the frozen workspace is not a folder")
    if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
        raise SnapshotError("the frozen workspace is not read-only: its files could change")
    return info.st_dev


def _listing(root: str, outbox: str, max_files: int) -> Any:
    """The file worker's listing of the layer, as a capture's reply holds it (JSON values)."""
    # "/." last: the listing opens its root without following a link, and a held layer's
    # root is a /proc/self/fd link (a name under it follows it, as under any folder).
    # The outbox under the same "/." (``_snapfiles`` leaves it out by that prefix).
    layer = _Layer(workspace=f"{root}/.", outbox=f"{root}/./{outbox}" if outbox else "")
    try:
        _, data = _snapfiles.pack({"phase": "list", "max_files": max_files + 1}, b"", layer)
    except _snapfiles.Refused as exc:
        if exc.code == errno.EFBIG:
            raise too_many_names(max_files) from None
        raise SnapshotError(f"the frozen workspace cannot be listed: {exc}") from None
    return json.loads(data)


def _read_listing(layer: Any, outbox: str, max_files: int) -> Any:
    """``_listing``, made by a reader (``snapshot_frozen(read_layer=)``)."""
    try:
        data = layer.listing(outbox, max_files + 1)
    except OSError as exc:
        if isinstance(exc, ConnectionError):
            raise
        if exc.errno == errno.EFBIG:
            raise too_many_names(max_files) from None
        raise SnapshotError(f"the frozen workspace cannot be listed: {exc}") from None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise SnapshotError(f"the frozen workspace's listing is malformed: {exc}") from None


def _read_digests(
    layer: Any, shape: Manifest, known: dict[bytes, Entry] | None = None
) -> dict[bytes, str]:
    """``_digests``, read by a reader (``snapshot_frozen(read_layer=)``): ``known``'s
    files, as there, not read."""
    digests: dict[bytes, str] = {}
    files = []
    for entry in shape.entries:
        if entry.kind is not EntryKind.FILE:
            continue
        same = None if known is None else known.get(entry.name)
        if same is not None and (same.size, same.mode) == (entry.size, entry.mode):
            digests[entry.name] = str(same.digest)
        else:
            files.append(entry)
    try:
        found = layer.digests([(entry.name, entry.size) for entry in files]) if files else []
    except OSError as exc:
        if isinstance(exc, ConnectionError):
            raise
        raise SnapshotError(f"the frozen workspace cannot be read: {exc}") from None
    digests.update((entry.name, digest) for entry, digest in zip(files, found, strict=True))
    return digests


def _inodes(listing: Any, device: int) -> Inodes:
    """Each regular file's inode in the layer and its bytes, as the budget counts them
    (a hard link's other names are its file's: the listing names the file once)."""
    return {
        (device, int(item["stat"][0])): int(item["size"])
        for item in listing
        if item.get("kind") == "file"
    }


def _digests(
    base: bytes, shape: Manifest, known: dict[bytes, Entry] | None = None
) -> dict[bytes, str]:
    """Each regular file's sha256, read from the layer; or ``known``'s, the same file's
    (its entry in a snapshot of the layers below, of the same size and mode)."""
    digests: dict[bytes, str] = {}
    for entry in shape.entries:
        if entry.kind is EntryKind.FILE:
            same = None if known is None else known.get(entry.name)
            if same is not None and (same.size, same.mode) == (entry.size, entry.mode):
                digests[entry.name] = str(same.digest)
                continue
            fd = open_regular(base + b"/" + entry.name, entry.name, replaced="is not a file")
            try:
                digests[entry.name] = hash_file(fd, entry.size, entry.name)
            finally:
                os.close(fd)
    return digests


def freezes_here(backend: str, session: SandboxSession | None = None) -> bool:
    """Whether a fork of ``backend``'s turn (``session``'s, where given) asks its sandbox to
    freeze the workspace.

    On bubblewrap and nsjail. As root the host stages the layer at a path in its store
    (a mount of its own, ``Tree.frozen``), which the forks' launchers bind as any tree.
    An ordinary user cannot mount in the host's namespace: it keeps the layer's
    descriptor (``Tree.held_layer``), which the forks' launchers pass to their servers;
    the layer is then the tmpfs the server made itself (``server/_heldfs``), the only
    kind a fork's server in another user namespace may clone.
    On Docker as root the host mounts in the server's mount namespace (``docker._freeze``)
    and stages the layer. As an ordinary user the server holds its tmpfs as above and
    passes it over the direct channel's socket; the host, which cannot read the turn's
    files (its leased uid's), has the backend's reader container list and hash them
    (``session.read_layer``, ``docker._reader``), and the forks' servers get an idmapped
    clone of it, made by the reader, with their hello the same way. Not where the turn
    speaks over the engine's attach stream (a remote engine), which carries no
    descriptor, nor without a reader. Not on ``docker-exec``, which runs no server to
    refuse while a call runs, nor remake its views.
    """
    if backend not in _FREEZES:
        return False
    if backend not in _PASSES or os.geteuid() == 0 or session is None:
        return True
    return callable(getattr(getattr(session, "channel", None), "take_passed", None)) and callable(
        getattr(session, "read_layer", None)
    )


def freeze_snapshot(
    session: SandboxSession,
    *,
    upper_bytes: int,
    budget: Budget,
    max_bytes: int,
    max_files: int,
    below: TurnSnapshot | None = None,
    lost: Callable[[], None] | None = None,
) -> TurnSnapshot | None:
    """The turn's files frozen in place (``sandbox._frozen.freeze``), as a snapshot, or None
    where the sandbox makes no freeze (the caller captures instead: nothing changed).

    Refused: while a call or detached process runs or a file is open for writing
    (``EBUSY``), over a workspace that is no tmpfs of its own (``EOPNOTSUPP``: opened
    from a snapshot, frozen already), on a kernel without the steps (Linux 6.8 lays an
    overlay from descriptors). Raises ``SnapshotError`` for a layer a capture refuses.
    ``below``: the snapshot the turn opened from, a stack of layers (``stacks_on``): the
    turn's own upper layer alone is frozen and stacked over it (``snapshot_stacked``).
    ``lost`` is called where that layer was frozen and is no snapshot (the host could not
    take, stage or read it): the turn then lies on it, no longer on ``below``, and a
    capture must not take a file it lacks for ``below``'s.
    """
    if below is not None:
        return _stacked_snapshot(
            session,
            below,
            upper_bytes=upper_bytes,
            budget=budget,
            max_bytes=max_bytes,
            max_files=max_files,
            lost=lost,
        )
    try:
        # An ordinary user's forks clone the layer in their own namespaces: only the
        # server's held original will do (refused before anything changes otherwise).
        fd = freeze(session, upper_bytes, held_only=os.geteuid() != 0)
    except OSError as exc:
        _copied_instead(session, exc)
        return None  # as it was, or frozen with the clone lost: a capture reads the overlay
    try:
        return snapshot_frozen(
            fd,
            budget=budget,
            max_bytes=max_bytes,
            max_files=max_files,
            read_layer=getattr(session, "read_layer", None),
        )
    except Unstaged as exc:
        _copied_instead(session, exc)
        return None  # the layer is gone with its descriptor: a capture reads the overlay


def _stacked_snapshot(
    session: SandboxSession,
    below: TurnSnapshot,
    *,
    upper_bytes: int,
    budget: Budget,
    max_bytes: int,
    max_files: int,
    lost: Callable[[], None] | None,
) -> TurnSnapshot | None:
    try:
        fd, userxattr = freeze_fork_layer(session, upper_bytes)
    except OSError as exc:
        if isinstance(exc, LayerLost) and lost is not None:
            lost()
        _copied_instead(session, exc)
        return None  # as it was (or frozen with the layer lost): a capture reads the overlay
    try:
        return snapshot_stacked(
            fd,
            below,
            userxattr=userxattr,
            budget=budget,
            max_bytes=max_bytes,
            max_files=max_files,
            reader=_reader_of(session),
        )
    except BaseException as exc:
        if lost is not None:
            lost()  # frozen, and no snapshot: the turn lies on a layer the host lost
        if not isinstance(exc, Unstaged):
            raise
        _copied_instead(session, exc)
        return None


def _reader_of(session: SandboxSession) -> Reader | None:
    """The session's reader of layers the host cannot read (an ordinary user's Docker), or
    None (the host reads them itself)."""
    read = getattr(session, "read_layer", None)
    merge = getattr(session, "merge_layers", None)
    if read is None or merge is None:
        return None
    return Reader(read=read, merge=merge)


def _copied_instead(session: SandboxSession, exc: Exception) -> None:
    """Say that a fork copies the files because the freeze was refused, and why: a fork that
    takes seconds and the workspace's size on disk, where it would take neither, is
    otherwise unexplained (a detached process left running is the common cause)."""
    code = exc.errno if isinstance(exc, OSError) else None
    fields = {
        "backend": session.backend,
        "errno": errno.errorcode.get(code, "") if code else "",
        "error": str(exc),
    }
    event(SNAPSHOTS, "snapshot.freeze_refused", fields)


def store_copy(snapshot: TurnSnapshot) -> Path | None:
    """The path of a frozen layer's copy in the store (the same names, for links), made
    the first time a capture would link from the layer and kept as long as the layer;
    None where it cannot be made (over the budget, unreadable): the capture reads.

    A capture over a fork of the layer links each unchanged file from here rather than
    read it through the sandbox, as from a store tree: the whole copy is paid once,
    only where some fork snapshots, and all their trees share its inodes. Its bytes
    count on the layer's budget (a file the copy and a tree share, once).
    """
    layer = snapshot.layer
    if layer is None:
        return snapshot.path
    with layer.copy_lock:
        if layer.copy is None:
            try:
                layer.copy = _copied(layer, snapshot.manifest)
            except (OSError, SnapshotError) as exc:
                event(SNAPSHOTS, "snapshot.layer_copy_failed", {"error": str(exc)}, WARNING)
                return None
        return layer.copy.path


def _copied(layer: Tree, manifest: Manifest) -> Tree:
    """``manifest``'s entries written from the staged layer into a new store tree (its
    files streamed by the layer's reader, checked against their digests, where this
    process cannot read them: ``Tree.reader``)."""
    tree = Tree(new_folder() / "tree", layer.budget)
    try:
        writer = TreeWriter(tree.path)
        try:
            if layer.reader is None or layer.held is None:
                base = os.fsencode(layer.path)
                for entry in manifest.entries:
                    _write(writer, base, entry)
            else:
                _write_read(writer, layer.reader, layer.held, manifest)
            writer.finish()
        finally:
            writer.close()
        tree.hold(writer.inodes)
    except BaseException:
        tree.remove()
        raise
    return tree


def _write_read(
    writer: TreeWriter,
    read: Callable[[int], AbstractContextManager[Any]],
    held: int,
    manifest: Manifest,
) -> None:
    """``manifest``'s entries written, each file's bytes streamed by the reader of the
    held layer ``held`` and checked as a save checks them (``checked_pieces``)."""
    files = [(e.name, e.size) for e in manifest.entries if e.kind is EntryKind.FILE]
    with read(held) as layer:
        contents = layer.contents(files)
        for entry in manifest.entries:
            if entry.kind is not EntryKind.FILE:
                _write(writer, b"", entry)
                continue
            offset = 0
            for piece in checked_pieces(entry, next(contents)):
                writer.piece(entry, offset, memoryview(piece))
                offset += len(piece)
            if entry.size == 0:
                writer.empty(entry)


def _write(writer: TreeWriter, base: bytes, entry: Entry) -> None:
    if entry.kind is EntryKind.DIR:
        writer.folder(entry)
    elif entry.kind is EntryKind.SYMLINK:
        writer.symlink(entry)
    elif entry.kind is EntryKind.HARDLINK:
        writer.hard_link(entry)
    elif entry.size == 0:
        writer.empty(entry)
    else:
        fd = open_regular(base + b"/" + entry.name, entry.name, replaced="is not a file")
        try:
            writer.copy(entry, fd)
        finally:
            os.close(fd)
