"""A turn's workspace out to the host and back in (stdlib only, Python 3.8+).

``Turn.snapshot`` and a turn opened from a snapshot reach the file worker as
two requests of their own, so both run as the calls' user, under the worker's
filter, and never with the server's privileges:

- ``snapshot`` lists the workspace (``phase: list``): every name under it, its
  kind, permission bits, size and link target, in the manifest's own JSON
  shape, and for a regular file what the host needs to know it unchanged: its
  ``stat`` (inode, mtime and ctime in ns; the reply's ``now_ns`` says when the
  walk began) and, on a workspace opened copy-on-write, ``lower``: no entry of
  the turn's upper layer at that name (so the overlay shows the snapshot's own
  file). Then it reads the bytes of the files the host asks for, in batches
  (``phase: read``); the host hashes them. Nothing is followed: every folder is
  opened by descriptor with ``O_NOFOLLOW`` from the one above it. The host
  checks all of it (the sandbox's own files are the model's to shape).
- ``restore`` makes folders, files, symlinks and hard links in a fresh
  workspace from records the host checked, folders' own modes last.

The server's own ``outbox`` folder, made for each call and emptied after it,
is left out.
"""

from __future__ import annotations

import errno
import os
import stat

# json and time are imported where they are used: every module here runs at each
# server start, and json is not on that path (see ``_session.BOOTSTRAP``).

TYPE_CHECKING = False
if TYPE_CHECKING:  # subscripted builtins are not usable at run time on Python 3.8
    from typing import Any

    Reply = tuple[dict[str, Any], bytes]

__all__ = ["UPPER_DEPTH", "UPPER_NAMES", "pack", "unpack", "upper_names"]

_CHUNK = 1 << 20
#: How deep the upper layer's listing goes: a tree nested deeper (the calls' to shape) gives
#: no names (None, "unknown"), and its snapshot reads every file.
UPPER_DEPTH = 64
#: How many names that listing holds at most; more, unknown likewise.
UPPER_NAMES = 1_000_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# The kinds a snapshot refuses, named as the host's message names them.
_SPECIAL = {
    stat.S_IFCHR: "chardev",
    stat.S_IFBLK: "blockdev",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


class Refused(Exception):
    """A request this module cannot answer: its errno and message go back to the host."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _text(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def _name(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _skipped(workspace: str, raw: Any) -> bytes:
    outbox = str(getattr(raw, "outbox", "") or "")
    prefix = workspace.rstrip("/") + "/"
    return outbox[len(prefix) :].encode() if outbox.startswith(prefix) else b""


def pack(header: dict[str, Any], body: bytes, raw: Any) -> Reply:
    """Answer one ``snapshot`` request: the listing, or a batch of files' bytes."""
    import json

    workspace = str(raw.workspace)
    phase = header.get("phase")
    if phase == "list":
        limit = int(header.get("max_files", 0))
        upper = int(getattr(raw, "upper", -1))
        return _listing(workspace, _skipped(workspace, raw), limit, upper)
    if phase == "read":
        return {}, _read_batch(workspace, json.loads(body.decode()))
    raise Refused(errno.EINVAL, f"unknown snapshot phase {phase!r}")


def _listing(workspace: str, skipped: bytes, limit: int, upper: int) -> Reply:
    import json
    import time

    began = time.time_ns()
    found: list[list[Any]] = []
    root = os.open(workspace, _DIR_FLAGS)
    try:
        _walk(root, skipped, found, limit)
    finally:
        os.close(root)
    changed = upper_names(upper)
    found.sort(key=lambda item: item[0])
    first: dict[tuple[int, int], bytes] = {}
    entries = []
    for name, found_kind, st, found_target in found:
        kind, target = found_kind, found_target
        if kind == "file" and st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            if key in first:
                kind, target = "hardlink", first[key]
            else:
                first[key] = name
        entry = {
            "name": _text(name),
            "kind": kind,
            "mode": stat.S_IMODE(st.st_mode),
            "size": st.st_size if kind == "file" else 0,
            "target": None if target is None else _text(target),
        }
        if kind == "file":
            entry["stat"] = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]
            if changed is not None and name not in changed:
                entry["lower"] = True
        entries.append(entry)
    fields = {"count": len(entries), "now_ns": began}
    return fields, json.dumps(entries, ensure_ascii=True).encode()


def upper_names(upper: int) -> set[bytes] | None:
    """Every name the turn's upper layer holds (a file, a folder, a whiteout), or None.

    ``upper``: a descriptor of that layer's folder (the server's file worker's, or
    Docker's host's, which lays the overlay itself: ``docker/_cow``). None when the
    workspace is no overlay, or its upper layer cannot be listed whole: a folder a
    call made unreadable, a tree nested past ``UPPER_DEPTH`` or holding more than
    ``UPPER_NAMES`` names. Then no file counts as the lower layer's (the snapshot
    reads them all). The overlay is mounted without redirects, so a name with no
    entry here shows the lower layer's file of the same name, unchanged. The walk
    is iterative, and holds two descriptors at most (``_open_folder``).
    """
    if upper < 0:
        return None
    names: set[bytes] = set()
    pending = [b""]
    try:
        while pending:
            folder = pending.pop()
            fd = _open_folder(upper, folder)
            try:
                with os.scandir(fd) as entries:
                    found = [
                        (os.fsencode(e.name), e.is_dir(follow_symlinks=False)) for e in entries
                    ]
            finally:
                os.close(fd)
            for name, is_dir in found:
                path = folder + b"/" + name if folder else name
                names.add(path)
                if is_dir:
                    if path.count(b"/") + 1 >= UPPER_DEPTH:
                        return None  # its names would lie deeper than the bound
                    pending.append(path)
            if len(names) > UPPER_NAMES:
                return None
    except OSError:
        return None
    return names


def _open_folder(root: int, name: bytes) -> int:
    """A new descriptor of the folder ``name`` under ``root`` (``b""``: root itself), each
    component opened from the one above without following a link: two open at most."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=root)
    if not name:
        return fd
    try:
        for part in name.split(b"/"):
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _walk(root: int, skipped: bytes, found: list[list[Any]], limit: int) -> None:
    """Every name under ``root`` into ``found`` as ``[name, kind, stat, target]``.

    Iterative, and each folder opened from ``root`` by ``_open_folder``: a tree a
    call nested hundreds of folders deep costs neither the stack nor descriptors.
    """
    pending = [b""]
    while pending:
        folder = pending.pop()
        fd = _open_folder(root, folder)
        try:
            for text in os.listdir(fd):
                name = os.fsencode(text)
                path = folder + b"/" + name if folder else name
                if path == skipped:
                    continue
                if limit and len(found) >= limit:
                    raise Refused(errno.EFBIG, f"the workspace holds more than {limit} names")
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                kind = _SPECIAL.get(stat.S_IFMT(st.st_mode))
                target = None
                if stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                    pending.append(path)
                elif stat.S_ISREG(st.st_mode):
                    kind = "file"
                elif stat.S_ISLNK(st.st_mode):
                    kind, target = "symlink", os.readlink(name, dir_fd=fd)
                found.append([path, kind or "unknown", st, target])
        finally:
            os.close(fd)


def _open_file(root: int, name: bytes) -> int:
    """Open the regular file ``name`` under ``root``, following no link on the way."""
    parts = name.split(b"/")
    fd = root
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != root:
                os.close(fd)
            fd = child
        opened = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise Refused(code, f"{_text(name)}: {os.strerror(code)}") from None
    finally:
        if fd != root:
            os.close(fd)
    if not stat.S_ISREG(os.fstat(opened).st_mode):
        os.close(opened)
        raise Refused(errno.ESTALE, f"{_text(name)} was replaced while the snapshot was taken")
    return opened


def _read_batch(workspace: str, wanted: list[list[Any]]) -> bytes:
    """The bytes of each ``[name, offset, length]`` in turn, each exactly ``length`` long."""
    root = os.open(workspace, _DIR_FLAGS)
    chunks = []
    try:
        for text, offset, length in wanted:
            name = _name(text)
            fd = _open_file(root, name)
            try:
                got = 0
                while got < length:
                    chunk = os.pread(fd, length - got, offset + got)
                    if not chunk:
                        raise Refused(errno.ESTALE, f"{text} shrank while the snapshot was taken")
                    chunks.append(chunk)
                    got += len(chunk)
            finally:
                os.close(fd)
    finally:
        os.close(root)
    return b"".join(chunks)


def unpack(header: dict[str, Any], body: bytes, raw: Any) -> Reply:
    """Answer one ``restore`` request: make each record's name in the workspace.

    A record is ``[kind, name, mode, target, offset, length, final]``: ``dir``
    (made private, its ``mode`` set by a later ``mode`` record), ``file``
    (``length`` bytes of the body written at ``offset``; ``final`` sets its
    mode), ``symlink``, ``hardlink`` (``target`` names the earlier file), or
    ``mode`` (a folder's own mode, sent once everything under it exists).
    """
    import json

    index = int(header.get("index_bytes", 0))
    records = json.loads(body[:index].decode())
    data = memoryview(body)[index:]
    root = os.open(str(raw.workspace), _DIR_FLAGS)
    # Records come in the manifest's order, so a folder's files follow one another: the
    # folder of the last record stays open for the next (one, not one per folder met: a
    # tree may be nested hundreds of folders deep).
    parent, fd = b"", -1
    used = 0
    text = ""
    try:
        for record in records:
            text, length = record[1], record[5]
            folder = _name(text).rpartition(b"/")[0]
            if fd < 0 or folder != parent:
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                fd, parent = _open_folder(root, folder), folder
            _make(record, fd, root, data[used : used + length])
            used += length
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise Refused(code, f"restoring {text}: {os.strerror(code)}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(root)
    return {"count": len(records)}, b""


def _make(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    """Make one record's name: ``fd`` is its folder, ``root`` the workspace's."""
    maker = _MAKERS.get(record[0])
    if maker is None:
        raise Refused(errno.EINVAL, f"unknown record kind {record[0]!r}")
    maker(record, fd, root, data)


def _leaf(record: list[Any]) -> bytes:
    return _name(record[1]).rpartition(b"/")[2]


def _make_dir(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    # Private until everything under it exists; its own mode comes in a ``mode`` record.
    leaf = _leaf(record)
    try:
        os.mkdir(leaf, 0o700, dir_fd=fd)
    except FileExistsError:  # the server's own folders (outbox) are there already
        if not stat.S_ISDIR(os.stat(leaf, dir_fd=fd, follow_symlinks=False).st_mode):
            raise


def _set_mode(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    os.chmod(_leaf(record), record[2], dir_fd=fd)  # a folder a ``dir`` record made: no link


def _write_piece(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    offset, final = record[4], record[6]
    flags = _NEW_FILE_FLAGS | (os.O_EXCL if offset == 0 else 0)
    out = os.open(_leaf(record), flags, 0o600, dir_fd=fd)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(out, data[written:], offset + written)
        if final:
            os.fchmod(out, record[2])
    finally:
        os.close(out)


def _make_symlink(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    os.symlink(_name(str(record[3])), _leaf(record), dir_fd=fd)


def _make_hardlink(record: list[Any], fd: int, root: int, data: memoryview) -> None:
    target, name = _name(str(record[3])), _name(record[1])
    os.link(target, name, src_dir_fd=root, dst_dir_fd=root, follow_symlinks=False)


#: How each kind of record is made, each as ``(record, folder fd, workspace fd, bytes)``.
_MAKERS = {
    "dir": _make_dir,
    "mode": _set_mode,
    "file": _write_piece,
    "symlink": _make_symlink,
    "hardlink": _make_hardlink,
}
