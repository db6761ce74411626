"""The host's file primitives, answered in the sandbox's own view (stdlib only, Python 3.8+).

``Turn.read_file``, ``Turn.write_file`` and ``Turn.list_dir`` reach the file
worker as ``fs`` requests: ``read`` (a byte range of a regular file), ``write``
(a byte range, creating the file and, if asked, its missing folders) and
``list`` (a folder's entries). The built-in file tools come the same way, as
``view`` (``_files``'s text for a model). The worker runs them as the calls' user, so the
kernel's permission checks and read-only mounts apply exactly as to a call,
and every path is resolved by ``_paths`` the way the built-in file tools
resolve it: one component at a time, links walked by hand and kept inside the
visible roots. A write must also land inside a *writable root* (the workspace
and writable mounts), checked on the resolved, link-free parent; the file
itself is opened with ``O_NOFOLLOW``, so a link planted at the name is
refused, never followed.

Refusals keep the errno they stand for, so the host raises the builtin error
a harness expects (``FileNotFoundError``, ``IsADirectoryError``,
``PermissionError``...). The host moves large files as several requests of at
most ``CHUNK_BYTES`` each, so no frame, and no process, ever holds a whole
large file.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from . import _files, _paths
from ._lean import suppress

# Annotations only: importing typing (and re, through it) costs every turn's start a few
# milliseconds, and mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:  # subscripted builtins are not usable at run time on Python 3.8
    from collections.abc import Callable
    from typing import Any

    Reply = tuple[dict[str, Any], bytes]

__all__ = ["CHUNK_BYTES", "LIST_MAX_ENTRIES", "handle"]

#: The most bytes one ``read`` or ``write`` request moves (the host splits larger files).
CHUNK_BYTES = 4 << 20
#: The most entries one ``list`` answer holds; the answer says when there were more.
LIST_MAX_ENTRIES = 10_000

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Folders made on the way to a written file, as ``mkdir -p`` would (the umask still applies).
_DIR_MODE = 0o777
_FILE_MODE = 0o666


def handle(header: dict[str, Any], body: bytes, ctx: Any) -> Reply:
    """Answer one ``fs`` request: ``(reply fields, reply body)``; never raises for bad input.

    A refusal is ``{"error": {"errno": NAME, "message": TEXT}}``.
    """
    files_ctx = _paths.FileContext.coerce(ctx)
    operation = _OPS.get(str(header.get("op")))
    if operation is None:
        return _error(errno.EINVAL, f"unknown file operation {header.get('op')!r}"), b""
    try:
        return operation(header, body, files_ctx, ctx)
    except _paths._Refusal as refusal:
        return _error(refusal.code, str(refusal)), b""
    except OSError as error:
        code = error.errno or errno.EIO
        return _error(code, f"{header.get('path')}: {os.strerror(code)}"), b""


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"errno": errno.errorcode.get(code, "EIO"), "message": message}}


def _int_field(header: dict[str, Any], name: str) -> int:
    value = header.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _paths._Refusal(f"{name} must be a non-negative integer")
    return value


def _path(header: dict[str, Any], ctx: _paths.FileContext) -> str:
    return _paths._path_argument({"path": header.get("path")}, ctx, required=True)


def _read(header: dict[str, Any], body: bytes, ctx: _paths.FileContext, raw: Any) -> Reply:
    path = _path(header, ctx)
    offset = _int_field(header, "offset")
    length = min(_int_field(header, "length"), CHUNK_BYTES)
    node, parent = _paths._resolve(path, ctx)
    try:
        fd = _paths._open_for_reading(node, parent, path)
    finally:
        _paths._close(node.fd)
        _paths._close(parent.fd)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        got = 0
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    return {"size": size}, b"".join(chunks)


def _writable_roots(ctx: _paths.FileContext, raw: Any) -> list[str]:
    roots = getattr(raw, "writable_roots", None) or ()
    return [ctx.sandbox_path(posixpath.normpath("/" + str(r).lstrip("/"))) for r in roots]


def _check_writable(target: str, ctx: _paths.FileContext, raw: Any, shown: str) -> None:
    roots = _writable_roots(ctx, raw)
    if not any(_paths._under(target, root) for root in roots):
        where = ", ".join(roots) if roots else "nowhere"
        raise _paths._Refusal(
            f"{shown} is outside the writable places; files can be written only under {where}.",
            errno.EACCES,
        )


def _open_folder(
    path: str, ctx: _paths.FileContext, raw: Any, *, make: bool, depth: int = 0
) -> _paths._Node:
    """Resolve the folder ``path`` (link-free, visible); with ``make``, create what is missing."""
    try:
        node, parent = _paths._resolve(path, ctx)
    except _paths._Refusal as refusal:
        if not make or refusal.code != errno.ENOENT or path == "/" or depth > 256:
            raise
        above = _open_folder(posixpath.dirname(path), ctx, raw, make=True, depth=depth + 1)
        try:
            name = posixpath.basename(path)
            _check_writable(_paths._child_path(above.path, name), ctx, raw, path)
            if above.fd is None:
                raise _paths._Refusal(f"{path} cannot be made here.", errno.EACCES) from None
            # Made meanwhile (another request, or a call)? Then resolve it as it is now.
            with suppress(FileExistsError):
                os.mkdir(name, _DIR_MODE, dir_fd=above.fd)
        finally:
            _paths._close(above.fd)
        node, parent = _paths._resolve(path, ctx)
    _paths._close(parent.fd)
    if not node.is_dir:
        _paths._close(node.fd)
        raise _paths._Refusal(f"{path} is not a directory.", errno.ENOTDIR)
    return node


def _write(header: dict[str, Any], body: bytes, ctx: _paths.FileContext, raw: Any) -> Reply:
    path = _path(header, ctx)
    offset = _int_field(header, "offset")
    folder, name = posixpath.split(path)
    if name in ("", ".", ".."):
        raise _paths._Refusal(f"{path} names a directory, not a file.", errno.EISDIR)
    try:
        parent = _open_folder(folder or "/", ctx, raw, make=bool(header.get("make_parents")))
    except _paths._Refusal as refusal:
        # A visible root, or a folder above one, has its parent out of reach: the refusal
        # would be about that parent, but what is wrong is that the path names a folder.
        if refusal.code == errno.EACCES and _is_folder(path, ctx):
            raise _paths._Refusal(f"{path} is a directory, not a file.", errno.EISDIR) from None
        raise
    try:
        fd = _open_for_writing(parent, name, path, ctx, raw, truncate=bool(header.get("truncate")))
    finally:
        _paths._close(parent.fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        view = memoryview(body)
        position = offset
        while view:
            written = os.pwrite(fd, view, position)
            view = view[written:]
            position += written
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return {"size": size}, b""


def _is_folder(path: str, ctx: _paths.FileContext) -> bool:
    """Whether ``path`` resolves (visibly) to a folder; False for anything refused."""
    try:
        node, parent = _paths._resolve(path, ctx)
    except _paths._Refusal:
        return False
    _paths._close(node.fd)
    _paths._close(parent.fd)
    return node.is_dir


def _open_for_writing(
    parent: _paths._Node, name: str, path: str, ctx: _paths.FileContext, raw: Any, *, truncate: bool
) -> int:
    """Open ``name`` in the resolved folder for writing, creating it; never through a link."""
    target = _paths._child_path(parent.path, name)
    if not _paths._visible(target, ctx):
        raise _paths._outside(path, ctx)
    _check_writable(target, ctx, raw, path)
    real = ctx.path_map.get(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _O_CLOEXEC
    if truncate:
        flags |= os.O_TRUNC
    try:
        if real is not None:
            return os.open(real, flags, _FILE_MODE)
        if parent.fd is not None:
            return os.open(name, flags, _FILE_MODE, dir_fd=parent.fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _paths._Refusal(
                f"{path} is a symbolic link; write_file never follows one.", errno.ELOOP
            ) from None
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise _paths._Refusal(
                f"{path}: permission denied; the sandbox user cannot write it "
                f"({os.strerror(error.errno)}).",
                errno.EACCES,
            ) from None
        if error.errno in (errno.ENXIO, errno.EOPNOTSUPP) and parent.fd is not None:
            # A FIFO nobody reads, or a socket: the kernel's "no such device" misleads.
            with suppress(OSError):
                mode = os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode
                raise _not_regular(path, mode) from None
        raise _paths._os_refusal(error, path, path) from None
    raise _paths._Refusal(f"{path} cannot be written here.", errno.EACCES)


def _not_regular(path: str, mode: int) -> _paths._Refusal:
    return _paths._Refusal(
        f"{path} is {_paths._kind(mode)}, not a regular file; write_file writes only files.",
        errno.EINVAL,
    )


def _list(header: dict[str, Any], body: bytes, ctx: _paths.FileContext, raw: Any) -> Reply:
    """A folder's entries as the body: ``KIND/NAME\\0`` each, the name's own bytes.

    A name holds neither ``/`` nor NUL, so the records need no escaping, and a
    name that is not UTF-8 comes back as the very bytes the host sends back to
    reach it. At most ``limit`` entries (``LIST_MAX_ENTRIES`` at most); ``more``
    says the folder held others, which then are not shown.
    """
    path = _path(header, ctx)
    limit = min(_int_field(header, "limit") or LIST_MAX_ENTRIES, LIST_MAX_ENTRIES)
    node, parent = _paths._resolve(path, ctx)
    try:
        fd = _paths._open_directory(node, path)
    finally:
        _paths._close(node.fd)
        _paths._close(parent.fd)
    entries: list[tuple[bytes, bytes]] = []
    more = False
    try:
        with os.scandir(fd) as scan:
            for entry in scan:
                if len(entries) >= limit:
                    more = True
                    break
                entries.append((os.fsencode(entry.name), _type_of(entry)))
    finally:
        os.close(fd)
    entries.sort()
    records = b"".join(b"%s/%s\0" % (kind, name) for name, kind in entries)
    return {"count": len(entries), "more": more}, records


def _type_of(entry: os.DirEntry[str]) -> bytes:
    try:
        if entry.is_symlink():
            return b"link"
        if entry.is_dir(follow_symlinks=False):
            return b"dir"
        if entry.is_file(follow_symlinks=False):
            return b"file"
    except OSError:
        pass
    return b"other"


def _view(header: dict[str, Any], body: bytes, ctx: _paths.FileContext, raw: Any) -> Reply:
    arguments = header.get("arguments")
    if not isinstance(arguments, dict):
        raise _paths._Refusal("'arguments' must be an object")
    text, is_error = _files.handle(str(header.get("view")), arguments, ctx)
    return {"text": text, "is_error": is_error}, b""


def _snapshot(header: dict[str, Any], body: bytes, ctx: _paths.FileContext, raw: Any) -> Reply:
    from . import _snapfiles  # only a turn that snapshots or restores pays for hashlib and json

    try:
        if header.get("op") == "pack":
            return _snapfiles.pack(header, body, raw)
        return _snapfiles.unpack(header, body, raw)
    except _snapfiles.Refused as refusal:
        return _error(refusal.code, str(refusal)), b""


_OPS: dict[str, Callable[[dict[str, Any], bytes, _paths.FileContext, Any], Reply]] = {
    "read": _read,
    "write": _write,
    "list": _list,
    "view": _view,
    "pack": _snapshot,
    "unpack": _snapshot,
}
