"""Safe path resolution in the sandbox's own view, for the file tools and primitives (stdlib, 3.8+).

Every path is resolved one component at a time from directory descriptors
opened with ``O_PATH | O_NOFOLLOW``. Symbolic links are never followed by the
kernel: this module reads each link and walks its target itself, checking at
every step that the path stays within the visible roots (system directories,
``/agent``, the workdir, mounted data and the workspace). A link swapped for
another between the check and the open gains nothing, because the open is
relative to an already-checked directory descriptor and refuses to follow a
link.

The views (``_files``) and the host's file primitives (``_fsops``) both resolve
through here, as the file worker's unprivileged user; a refusal is the model's
(or the host's) mistake, with the errno it stands for.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from ._lean import suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FileContext"]

# Symbolic links followed while resolving one path, as the kernel's own limit.
_MAX_LINKS = 40
# Sandbox paths that are never data, whatever the caller passes as a visible root:
# /proc/self/root alone would otherwise lead anywhere.
_NEVER_ROOTS = ("/", "/proc", "/sys", "/dev")
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
        self.path_map = {
            posixpath.normpath(str(key)): posixpath.normpath(str(value))
            for key, value in (path_map or {}).items()
            if posixpath.normpath(str(key)) != posixpath.normpath(str(value))
        }
        self.workdir = self.sandbox_path(_absolute(workdir))
        roots: list[str] = []
        for root in visible_roots:
            clean = self.sandbox_path(_absolute(root))
            if clean not in _NEVER_ROOTS and clean not in roots:
                roots.append(clean)
        self.visible_roots = roots
        self.deadline = deadline
        self.timeout = timeout

    @classmethod
    def coerce(cls, ctx: object) -> FileContext:
        """This module's context from any object with the same attributes (the server's own)."""
        if isinstance(ctx, cls):
            return ctx
        return cls(
            workdir=getattr(ctx, "workdir"),  # noqa: B009 - any object with these attributes
            visible_roots=tuple(getattr(ctx, "visible_roots")),  # noqa: B009
            deadline=getattr(ctx, "deadline", None),
            timeout=getattr(ctx, "timeout", None),
            path_map=dict(getattr(ctx, "path_map", None) or {}),
        )

    def sandbox_path(self, path: str) -> str:
        """Map a real path under a ``path_map`` target back to its sandbox path.

        The server may hand over paths it already mapped to the host's view;
        everything here works in the sandbox's view, so the model sees only
        sandbox paths and links are followed as they would be in a sandbox.
        """
        for prefix, real in sorted(self.path_map.items(), key=lambda item: -len(item[1])):
            if path == real or path.startswith(real.rstrip("/") + "/"):
                return prefix + path[len(real) :] if prefix != "/" else path[len(real) :] or "/"
        return path

    def __repr__(self) -> str:
        return (
            f"FileContext(workdir={self.workdir!r}, visible_roots={self.visible_roots!r}, "
            f"deadline={self.deadline!r}, timeout={self.timeout!r}, path_map={self.path_map!r})"
        )


def _absolute(path: object) -> str:
    return posixpath.normpath("/" + str(path).lstrip("/"))


class _Refusal(Exception):
    """The model's mistake: the message is the tool's error result.

    ``code`` is the errno it stands for, so the host's file API (``_fsops``) can
    raise the builtin error a harness expects from the very same refusal.
    """

    def __init__(self, message: str, code: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.code = code


def _path_argument(arguments: dict[str, Any], ctx: FileContext, *, required: bool) -> str:
    value = arguments.get("path")
    if value is None or value == "":
        if required:
            raise _Refusal(
                "path is required: give the file's path, absolute or relative to the workdir."
            )
        return ctx.workdir
    if not isinstance(value, str):
        raise _Refusal(f"path must be a string, not {value!r}.")
    if "\x00" in value:
        raise _Refusal("path must not contain a NUL character.")
    try:
        os.fsencode(value)
    except UnicodeEncodeError as error:
        # A lone surrogate no file name decodes to: no file has this name.
        raise _Refusal(
            f"path holds {value[error.start]!r}, a lone surrogate that no file name has; "
            "give the name as the text list or glob show.",
            errno.ENOENT,
        ) from None
    # Joined, not normalised: ".." is resolved during the walk, after the links before it.
    return ctx.sandbox_path(posixpath.join(ctx.workdir, value))


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
        f"{', '.join(ctx.visible_roots)}.",
        errno.EACCES,
    )


class _Node:
    """A resolved, link-free sandbox path and an ``O_PATH`` descriptor of what it names.

    ``fd`` is ``None`` for a virtual directory: in the unconfined mode, an ancestor
    of a mapped path that exists only to lead to it.
    """

    def __init__(
        self, path: str, fd: int | None, st: os.stat_result | None, real: str | None = None
    ) -> None:
        self.path = path
        self.fd = fd
        self.st = st
        #: The trusted host path of a mapped node (unconfined mode), else None.
        self.real = real

    @property
    def is_dir(self) -> bool:
        return self.st is None or stat.S_ISDIR(self.st.st_mode)


def _close(fd: int | None) -> None:
    if fd is not None:
        with suppress(OSError):
            os.close(fd)


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
        return _Node(path, fd, os.fstat(fd), real)
    if any(_under(key, path) for key in ctx.path_map):
        return _Node(path, None, None)
    if parent.fd is None:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    fd = os.open(name, _O_PATH | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=parent.fd)
    return _Node(path, fd, os.fstat(fd))


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _resolve(path: str, ctx: FileContext) -> tuple[_Node, _Node]:
    """Resolve an absolute sandbox path to a link-free node inside the visible roots.

    Returns the node and its parent directory (both open: the caller closes them).
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
                raise _Refusal(
                    f"{path} does not exist: {current.path} is not a directory.", errno.ENOTDIR
                )
            child = _child_path(current.path, name)
            if not _on_the_way(child, ctx):
                raise _outside(path if child == path else f"{path} (through {child})", ctx)
            try:
                node = _open_child(current, name, ctx)
            except OSError as error:
                raise _os_refusal(error, path, child) from None
            if node.st is not None and stat.S_ISLNK(node.st.st_mode):
                links += 1
                target = _link_target(node, path, child, links)
                if target.startswith("/"):
                    while len(stack) > 1:
                        _close(stack.pop().fd)
                pending[:0] = _split(target) if target.strip("/") else []
                continue
            stack.append(node)
        final = stack[-1]
        if not _visible(final.path, ctx):
            raise _outside(path if final.path == path else f"{path} (which is {final.path})", ctx)
        parent = stack[-2]
        del stack[-2:]
        return final, parent
    finally:
        for node in stack:
            _close(node.fd)


def _link_target(node: _Node, path: str, child: str, links: int) -> str:
    """Read (and close) a link met while resolving ``path``; the caller walks its target."""
    try:
        if links > _MAX_LINKS:
            raise _Refusal(f"{path} has too many levels of symbolic links.", errno.ELOOP)
        return os.readlink("", dir_fd=node.fd)
    except OSError as error:
        raise _os_refusal(error, path, child) from None
    finally:
        _close(node.fd)


def _os_refusal(error: OSError, path: str, where: str) -> _Refusal:
    code = error.errno or errno.EIO
    if code == errno.ENOENT:
        return _Refusal(
            f"{path} does not exist."
            if where == path
            else f"{path} does not exist ({where} is missing).",
            code,
        )
    if code in (errno.EACCES, errno.EPERM):
        return _Refusal(f"{path}: permission denied; the sandbox user cannot read {where}.", code)
    if code == errno.ENOTDIR:
        return _Refusal(f"{path} does not exist: a component of {where} is not a directory.", code)
    if code == errno.ELOOP:
        return _Refusal(f"{path} has too many levels of symbolic links.", code)
    return _Refusal(f"{path}: {os.strerror(code)}.", code)


def _open_refusal(error: OSError, path: str, verb: str) -> _Refusal:
    """Why opening ``path`` to ``verb`` it (read, list) failed: a refused permission is
    worded by what the tool does, anything else as ``_os_refusal`` words it."""
    if error.errno in (errno.EACCES, errno.EPERM):
        return _Refusal(
            f"{path}: permission denied; the sandbox user cannot {verb} it.", errno.EACCES
        )
    return _os_refusal(error, path, path)


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


def _open_for_reading(node: _Node, parent: _Node, path: str) -> int:
    """Open a resolved node's file for reading; only a regular file, and never blocking."""
    if node.st is None or node.is_dir:
        raise _Refusal(
            f"{path} is a directory, not a file; use list or glob to see what it holds.",
            errno.EISDIR,
        )
    if not stat.S_ISREG(node.st.st_mode):
        what = _kind(node.st.st_mode)
        raise _Refusal(f"{path} is {what}, not a regular file; read shows text files only.")
    # Reopen relative to the checked parent without following a link, then make sure it is
    # the very file checked: O_NONBLOCK keeps a FIFO swapped in meanwhile from blocking.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _O_CLOEXEC
    try:
        if node.real is not None:
            fd = os.open(node.real, flags)
        elif parent.fd is not None:
            name = posixpath.basename(node.path)
            fd = os.open(name, flags | os.O_NOFOLLOW, dir_fd=parent.fd)
        else:
            # Only a mapped path sits in a virtual directory; never open relative to the cwd.
            raise _Refusal(f"{path} does not exist.", errno.ENOENT)
    except OSError as error:
        raise _open_refusal(error, path, "read") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (node.st.st_dev, node.st.st_ino):
        os.close(fd)
        raise _Refusal(f"{path} changed while it was being opened; try again.", errno.EAGAIN)
    return fd


def _open_directory(node: _Node, path: str) -> int:
    if node.st is not None and not node.is_dir:
        what = "a file" if stat.S_ISREG(node.st.st_mode) else _kind(node.st.st_mode)
        raise _Refusal(f"{path} is {what}, not a directory; use read for a file.", errno.ENOTDIR)
    if node.fd is None:
        raise _Refusal(f"{path} is not a directory the file tools can list.", errno.EACCES)
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC, dir_fd=node.fd)
    except OSError as error:
        raise _open_refusal(error, path, "list") from None
