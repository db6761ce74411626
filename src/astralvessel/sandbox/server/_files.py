"""The file tools ``read``, ``glob`` and ``list``, answered in the sandbox's own view.

The sandbox server's unprivileged file worker calls ``handle``. It runs inside
the sandbox as the sandbox's user (or, for the unconfined backend, on the host
with ``path_map`` translating sandbox paths), so the kernel's permission checks
are the sandbox user's: nothing here can show a file that user could not read.

Every path is resolved one component at a time from directory descriptors
opened with ``O_PATH | O_NOFOLLOW``. Symbolic links are never followed by the
kernel: this module reads each link and walks its target itself, checking at
every step that the path stays within the visible roots (system directories,
``/agent``, the workdir, mounted data and the workspace). A link swapped for
another between the check and the open gains nothing, because the open is
relative to an already-checked directory descriptor and refuses to follow a
link.

This module is stdlib only and runs on Python 3.8+, because in a Docker
sandbox it runs on the image's ``python3``.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import time
from typing import Any, Iterator

__all__ = ["BINARY_PROBE_BYTES", "FileContext", "handle"]

#: ``read``: default and largest ``limit``, default ``offset``, longest line shown whole.
READ_DEFAULT_LIMIT = 400
READ_MAX_LIMIT = 2000
READ_DEFAULT_OFFSET = 1
READ_MAX_LINE_CHARS = 4000
#: ``glob``: default and largest ``max_results``.
GLOB_DEFAULT_MAX = 200
GLOB_MAX = 2000
#: ``list``: entries shown at most.
LIST_MAX_ENTRIES = 500
#: A file with a NUL byte in its first 8 KiB is binary.
BINARY_PROBE_BYTES = 8192

TRUNCATED_MARK = " [line truncated]"

# Symbolic links followed while resolving one path, as the kernel's own limit.
_MAX_LINKS = 40
# Sandbox paths that are never data, whatever the caller passes as a visible root:
# /proc/self/root alone would otherwise lead anywhere.
_NEVER_ROOTS = ("/", "/proc", "/sys", "/dev")
_CHUNK = 1 << 20
# Bytes read of one line before it is known to be over the character cap (UTF-8 is at
# most 4 bytes a character, and an invalid byte decodes to one character).
_LINE_BYTES = READ_MAX_LINE_CHARS * 4 + 4

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_PATH = getattr(os, "O_PATH", 0)


class FileContext:
    """Where one file-tool call runs: the workdir, what it may show, and when it must stop.

    ``visible_roots`` are sandbox paths. ``deadline`` is a ``time.monotonic()``
    value after which ``glob`` stops, and ``timeout`` the seconds it names when it
    does. ``path_map`` maps a sandbox path prefix to the real path holding it,
    for the unconfined backend where the server runs in the host's view; leave it
    empty inside a real sandbox.
    """

    def __init__(
        self,
        workdir: str,
        visible_roots: list[str] | tuple[str, ...],
        deadline: float | None = None,
        timeout: float | None = None,
        path_map: dict[str, str] | None = None,
    ) -> None:
        self.workdir = posixpath.normpath("/" + str(workdir).lstrip("/"))
        roots = []
        for root in visible_roots:
            clean = posixpath.normpath("/" + str(root).lstrip("/"))
            if clean not in _NEVER_ROOTS and clean not in roots:
                roots.append(clean)
        self.visible_roots = roots
        self.deadline = deadline
        self.timeout = timeout
        self.path_map = {
            posixpath.normpath(key): value
            for key, value in (path_map or {}).items()
            if posixpath.normpath(key) != value
        }

    def __repr__(self) -> str:
        return (
            f"FileContext(workdir={self.workdir!r}, visible_roots={self.visible_roots!r}, "
            f"deadline={self.deadline!r}, timeout={self.timeout!r}, path_map={self.path_map!r})"
        )


class _Refusal(Exception):
    """The model's mistake: the message is the tool's error result."""


def handle(tool: str, arguments: dict[str, Any], ctx: FileContext) -> tuple[str, bool]:
    """Run ``read``, ``glob`` or ``list`` and return ``(text, is_error)``; never raises for bad input."""
    try:
        if tool == "read":
            return _read(arguments, ctx), False
        if tool == "glob":
            return _glob(arguments, ctx), False
        if tool == "list":
            return _list(arguments, ctx), False
    except _Refusal as refusal:
        return str(refusal), True
    return f"{tool!r} is not a file tool; the file tools are read, glob and list.", True


# -- arguments ----------------------------------------------------------------------------


def _int_argument(arguments: dict[str, Any], name: str, default: int, low: int, high: int | None) -> int:
    value = arguments.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refusal(f"{name} must be an integer, not {value!r}.")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _Refusal(f"{name} must be {bound}; got {value}.")
    return value


def _path_argument(arguments: dict[str, Any], ctx: FileContext, *, required: bool) -> str:
    value = arguments.get("path")
    if value is None or value == "":
        if required:
            raise _Refusal("path is required: give the file's path, absolute or relative to the workdir.")
        return ctx.workdir
    if not isinstance(value, str):
        raise _Refusal(f"path must be a string, not {value!r}.")
    if "\x00" in value:
        raise _Refusal("path must not contain a NUL character.")
    # Joined, not normalised: ".." is resolved during the walk, after the links before it.
    return posixpath.join(ctx.workdir, value)


# -- safe resolution ------------------------------------------------------------------------


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _visible(path: str, ctx: FileContext) -> bool:
    return any(_under(path, root) for root in ctx.visible_roots)


def _on_the_way(path: str, ctx: FileContext) -> bool:
    """Whether ``path`` is visible or an ancestor of a visible root (a step on the way to one)."""
    return _visible(path, ctx) or any(_under(root, path) for root in ctx.visible_roots)


def _outside(shown: str, ctx: FileContext) -> _Refusal:
    return _Refusal(
        f"{shown} is outside the agent's data. The file tools can reach only "
        f"{', '.join(ctx.visible_roots)}."
    )


class _Node:
    """A resolved, link-free sandbox path and an ``O_PATH`` descriptor of what it names.

    ``fd`` is ``None`` for a virtual directory: in the unconfined mode, an ancestor
    of a mapped path that exists only to lead to it.
    """

    def __init__(self, path: str, fd: int | None, st: os.stat_result | None) -> None:
        self.path = path
        self.fd = fd
        self.st = st

    @property
    def is_dir(self) -> bool:
        return self.st is None or stat.S_ISDIR(self.st.st_mode)


def _close(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _open_root(ctx: FileContext) -> _Node:
    fd = os.open("/", _O_PATH | os.O_DIRECTORY | _O_CLOEXEC)
    return _Node("/", fd, os.fstat(fd))


def _child_path(parent: str, name: str) -> str:
    return "/" + name if parent == "/" else parent + "/" + name


def _open_child(parent: _Node, name: str, ctx: FileContext) -> _Node:
    """Open ``name`` in ``parent`` without following a link; raises OSError as the kernel does."""
    path = _child_path(parent.path, name)
    real = ctx.path_map.get(path)
    if real is not None:
        # The host configured this mapping; its real path is trusted, not the model's.
        fd = os.open(real, _O_PATH | _O_CLOEXEC)
        return _Node(path, fd, os.fstat(fd))
    if any(_under(key, path) for key in ctx.path_map):
        return _Node(path, None, None)
    if parent.fd is None:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    fd = os.open(name, _O_PATH | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=parent.fd)
    return _Node(path, fd, os.fstat(fd))


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _resolve(path: str, ctx: FileContext) -> _Node:
    """Resolve an absolute sandbox path to a link-free node inside the visible roots.

    Raises ``_Refusal`` for anything outside them, missing, or unreadable on the way.
    """
    stack = [_open_root(ctx)]
    pending = _split(path)
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            current = stack[-1]
            if name == "..":
                # The stack holds only resolved directories, so its parent is the real parent.
                if len(stack) > 1:
                    _close(stack.pop().fd)
                continue
            if not current.is_dir:
                raise _Refusal(f"{path} does not exist: {current.path} is not a directory.")
            child = _child_path(current.path, name)
            if not _on_the_way(child, ctx):
                raise _outside(path if child == path else f"{path} (through {child})", ctx)
            try:
                node = _open_child(current, name, ctx)
            except OSError as error:
                raise _os_refusal(error, path, child) from None
            if node.st is not None and stat.S_ISLNK(node.st.st_mode):
                links += 1
                try:
                    target = os.readlink("", dir_fd=node.fd)
                except OSError as error:
                    raise _os_refusal(error, path, child) from None
                finally:
                    _close(node.fd)
                if links > _MAX_LINKS:
                    raise _Refusal(f"{path} has too many levels of symbolic links.")
                if target.startswith("/"):
                    while len(stack) > 1:
                        _close(stack.pop().fd)
                pending[:0] = _split(target) if target.strip("/") else []
                continue
            stack.append(node)
        final = stack[-1]
        if not _visible(final.path, ctx):
            raise _outside(path if final.path == path else f"{path} (which is {final.path})", ctx)
        stack.pop()
        return final
    finally:
        for node in stack:
            _close(node.fd)


def _os_refusal(error: OSError, path: str, where: str) -> _Refusal:
    code = error.errno
    if code == errno.ENOENT:
        return _Refusal(f"{path} does not exist." if where == path else f"{path} does not exist ({where} is missing).")
    if code in (errno.EACCES, errno.EPERM):
        return _Refusal(f"{path}: permission denied; the sandbox user cannot read {where}.")
    if code == errno.ENOTDIR:
        return _Refusal(f"{path} does not exist: a component of {where} is not a directory.")
    if code == errno.ELOOP:
        return _Refusal(f"{path} has too many levels of symbolic links.")
    return _Refusal(f"{path}: {os.strerror(code) if code else error}.")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _open_for_reading(node: _Node, path: str) -> int:
    """Open a resolved node's file for reading; only a regular file, and never blocking."""
    if node.st is None or not stat.S_ISREG(node.st.st_mode):
        if node.is_dir:
            raise _Refusal(f"{path} is a directory, not a file; use list or glob to see what it holds.")
        raise _Refusal(f"{path} is {_kind(node.st.st_mode)}, not a regular file; read shows text files only.")
    # Reopen through the O_PATH descriptor so the file opened is exactly the one checked;
    # O_NONBLOCK keeps a FIFO swapped in meanwhile from blocking, and fstat refuses it.
    try:
        fd = os.open(
            f"/proc/self/fd/{node.fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _O_CLOEXEC
        )
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM):
            raise _Refusal(f"{path}: permission denied; the sandbox user cannot read it.") from None
        raise _os_refusal(error, path, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (node.st.st_dev, node.st.st_ino):
        os.close(fd)
        raise _Refusal(f"{path} changed while it was being opened; try again.")
    return fd


def _open_directory(node: _Node, path: str) -> int:
    if not node.is_dir:
        assert node.st is not None
        what = "a file" if stat.S_ISREG(node.st.st_mode) else _kind(node.st.st_mode)
        raise _Refusal(f"{path} is {what}, not a directory; use read for a file.")
    if node.fd is None:
        raise _Refusal(f"{path} is not a directory the file tools can list.")
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC, dir_fd=node.fd)
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM):
            raise _Refusal(f"{path}: permission denied; the sandbox user cannot list it.") from None
        raise _os_refusal(error, path, path) from None
