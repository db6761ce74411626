"""The workspace frozen in place, copy-on-write, for the host to fork from (stdlib, 3.8+).

A turn's first fork would otherwise copy the whole workspace (the sandbox's
tmpfs) out to the host's snapshot store. Instead the server freezes that tmpfs
where it is and hands the host a mount of it, and the turn goes on writing on an
overlay above it:

- **The clone first.** ``open_tree(OPEN_TREE_CLONE)`` gives a detached mount of
  the workspace's tmpfs, a descriptor no path reaches: the host takes it
  (``pidfd_getfd``) and lays its forks' overlays on it. It is made before the
  freeze so that nothing can come between the two.
- **The freeze.** ``fspick`` and ``FSCONFIG_CMD_RECONFIGURE`` with ``ro`` make
  the tmpfs's *superblock* read-only: every mount of it, the clone, the
  workspace's own mount, one a call's mount namespace copied, one a process
  holds as its working folder, refuses writes from then on. A file open for
  writing anywhere (a detached process's log, a file deleted but held open)
  makes the kernel refuse with ``EBUSY``: nothing has changed then, and the host
  copies the files instead. The clone's own mount is also made read-only, so a
  holder of the descriptor that could reconfigure the superblock back (the host,
  as root) still writes nothing through it.
- **The upper layer.** A fresh tmpfs, bounded in bytes as the host asks (the
  turn's disk limit) and in inodes as the workspace was, attached nowhere: the
  overlay holds it. Its ``upper`` folder takes the frozen root's owner and mode,
  or the merged root would be root's, mode 0755, and the calls' user could
  create nothing in it. It is made before the freeze, so that a refusal there
  (no memory, no capability) changes nothing either.
- **The overlay**, made with the new mount API over descriptors alone (the
  sandbox's ``/proc`` belongs to another PID namespace, so no ``/proc/self/fd``
  path names them): the clone below, the upper layer above, ``nosuid`` and
  ``nodev`` as the tmpfs was, moved onto the workspace's path. As an ordinary
  user its own attributes are ``user.*`` ones (``userxattr``, which implies no
  redirects); as root ``trusted.*``, with redirects not followed (as
  ``_lowerfs``). A step refused after the freeze thaws the tmpfs again (``rw``),
  so the turn is left as it was.

What the freeze does not do, the server does around it (``_main``): its helpers
that keep a mount namespace of their own (the file worker, the spare call's
namespaces) were copied from the old view, so they are retired and made again;
and it refuses a freeze (``EBUSY``) while a call or detached process runs, which
would keep the old view, read-only from then on, under a process the host
expects to go on.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from . import _lowerfs, _sys
from ._calls import map_path
from ._lean import suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._launch import LaunchPlan
    from ._messages import Hello

__all__ = [
    "OVERLAYFS_MAGIC",
    "TMPFS_MAGIC",
    "answer",
    "filesystem_type",
    "freeze_fork",
    "freeze_workspace",
    "fstatfs_type",
    "move_overlay",
    "not_here",
    "prepared",
    "refused",
    "release",
    "thaw_fork_layer",
    "thaw_unlaid",
]

TMPFS_MAGIC = 0x01021994
OVERLAYFS_MAGIC = 0x794C7630
# The new mount API's numbers are the same on every architecture (Linux 5.2 onwards).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_SYS_FSPICK = 433
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_SYMLINK_NOFOLLOW = 0x100
_OPEN_TREE_CLONE = 1
_FSOPEN_CLOEXEC = 1
_FSPICK_CLOEXEC = 1
_FSPICK_EMPTY_PATH = 8
_FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_SET_FD = 5
_FSCONFIG_CMD_CREATE = 6
_FSCONFIG_CMD_RECONFIGURE = 7
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
# struct statfs is at most 120 bytes on 64-bit Linux; f_type (a long) comes first.
_STATFS_BYTES = 256


def _config(
    fs: int,
    command: int,
    key: str | None = None,
    value: str | None = None,
    *,
    aux: int = 0,
    what: str,
) -> None:
    _lowerfs.syscall(
        _SYS_FSCONFIG, what, ctypes.c_int(fs), ctypes.c_uint(command),
        ctypes.c_char_p(None if key is None else key.encode()),
        ctypes.c_char_p(None if value is None else value.encode()), ctypes.c_int(aux),
    )  # fmt: skip


def _fsopen(kind: str) -> int:
    return _lowerfs.syscall(
        _SYS_FSOPEN, f"fsopen {kind}", ctypes.c_char_p(kind.encode()),
        ctypes.c_uint(_FSOPEN_CLOEXEC),
    )  # fmt: skip


def _fsmount(fs: int, what: str) -> int:
    attrs = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
    return _lowerfs.syscall(
        _SYS_FSMOUNT, what, ctypes.c_int(fs), ctypes.c_uint(_FSMOUNT_CLOEXEC), ctypes.c_uint(attrs)
    )


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with suppress(OSError):
                os.close(fd)


def filesystem_type(path: str) -> int:
    """``statfs``'s ``f_type`` of the filesystem at ``path`` (``TMPFS_MAGIC`` for a tmpfs)."""
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    _sys.check(_sys.libc().statfs(ctypes.c_char_p(path.encode()), buffer), f"statfs {path}")
    return int(struct.unpack_from("=l", buffer.raw)[0])


def _upper_tmpfs(size: int, inodes: int) -> int:
    """A detached tmpfs of ``size`` bytes and ``inodes`` entries, holding ``upper`` and ``work``."""
    fs = _fsopen("tmpfs")
    try:
        _config(fs, _FSCONFIG_SET_STRING, "size", str(size), what="fsconfig size")
        if inodes > 0:
            _config(fs, _FSCONFIG_SET_STRING, "nr_inodes", str(inodes), what="fsconfig nr_inodes")
        _config(fs, _FSCONFIG_SET_STRING, "mode", "0700", what="fsconfig mode")
        _config(fs, _FSCONFIG_CMD_CREATE, what="create the upper tmpfs")
        layers = _fsmount(fs, "fsmount the upper tmpfs")
    finally:
        _close(fs)
    try:
        os.mkdir("upper", 0o700, dir_fd=layers)
        os.mkdir("work", 0o700, dir_fd=layers)
    except OSError:
        _close(layers)
        raise
    return layers


def _set_ro(path: str, read_only: bool, *, at: int = _AT_FDCWD) -> None:
    """Reconfigure the superblock of the filesystem at ``path`` read-only (or back); ``at``:
    a descriptor on that filesystem instead, ``path`` empty."""
    flags = _FSPICK_CLOEXEC | (0 if path else _FSPICK_EMPTY_PATH)
    pick = _lowerfs.syscall(
        _SYS_FSPICK, "fspick", ctypes.c_int(at), ctypes.c_char_p(path.encode()),
        ctypes.c_uint(flags),
    )  # fmt: skip
    try:
        flag = "ro" if read_only else "rw"
        _config(pick, _FSCONFIG_SET_FLAG, flag, what=f"fsconfig {flag}")
        what = "freeze the workspace" if read_only else "thaw the workspace"
        _config(pick, _FSCONFIG_CMD_RECONFIGURE, what=what)
    finally:
        _close(pick)


def _mount_read_only(tree: int) -> None:
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0), 32)
    _lowerfs.syscall(
        _SYS_MOUNT_SETATTR, "mount_setattr (the clone read-only)", ctypes.c_int(tree),
        ctypes.c_char_p(b""), ctypes.c_uint(_AT_EMPTY_PATH), attr, ctypes.c_size_t(32),
    )  # fmt: skip


def _overlay(
    workspace: str,
    clone: int | list[int],
    layers: int,
    userxattr: bool,
    move_into: tuple[int, str] | None = None,
) -> None:
    """Mount the overlay of ``clone`` (or of these layers, top first) under ``layers``'s
    ``upper`` on ``workspace``, or, with ``move_into`` (a mount namespace's descriptor
    and a path there), made here and moved onto that path in that namespace."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    upper = work = fs = merged = -1
    lowers = clone if isinstance(clone, list) else [clone]
    try:
        upper = os.open("upper", flags, dir_fd=layers)
        work = os.open("work", flags, dir_fd=layers)
        fs = _fsopen("overlay")
        fields = [("lowerdir+", fd) for fd in lowers] + [("upperdir", upper), ("workdir", work)]
        for key, fd in fields:
            _config(fs, _FSCONFIG_SET_FD, key, aux=fd, what=f"fsconfig {key}")
        if userxattr:
            _config(fs, _FSCONFIG_SET_FLAG, "userxattr", what="fsconfig userxattr")
        else:
            _config(fs, _FSCONFIG_SET_STRING, "redirect_dir", "nofollow", what="fsconfig redirect")
        _config(fs, _FSCONFIG_CMD_CREATE, what="create the overlay")
        merged = _fsmount(fs, "fsmount the overlay")
        if move_into is not None:
            # Detached, the overlay may go to another namespace; its layers, mounts of this
            # one, could not have been taken there (the kernel clones only its own).
            _sys.setns(move_into[0], _sys.CLONE_NEWNS)
            workspace = move_into[1]
        _moved(merged, workspace)
    finally:
        _close(upper, work, fs, merged)


def _moved(mount: int, path: str) -> None:
    """Move the detached mount ``mount`` onto ``path`` (in this namespace)."""
    _lowerfs.syscall(
        _SYS_MOVE_MOUNT, "move_mount the overlay", ctypes.c_int(mount), ctypes.c_char_p(b""),
        ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(path.encode()),
        ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
    )  # fmt: skip


def move_overlay(source: str, move_into: tuple[int, str]) -> None:
    """Move a clone of the overlay mounted on ``source`` (a path of this namespace) onto
    ``move_into``'s path in that mount namespace (its descriptor): root's host lays a warm
    Docker sandbox's adoption overlay itself (``docker._adoption``), where its layers are
    (the kernel takes an overlay's layers from its maker's own namespace alone), and the
    server's workspace becomes it. The clone is of that one mount, not what lies below."""
    clone = _lowerfs.syscall(
        _SYS_OPEN_TREE, "open_tree (the overlay)", ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(source.encode()), ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
    )  # fmt: skip
    try:
        if fstatfs_type(clone) != OVERLAYFS_MAGIC:
            raise OSError(errno.EINVAL, f"{source} is no overlay")
        _sys.setns(move_into[0], _sys.CLONE_NEWNS)
        _moved(clone, move_into[1])
    finally:
        _close(clone)


def _freeze_and_lay(  # noqa: PLR0917 - the steps' inputs, in order
    workspace: str,
    superblock: tuple[str, int],
    clone: int,
    lower: int | list[int],
    layers: int,
    userxattr: bool,
    upper_to: Callable[[int], None] | None,
    move_into: tuple[int, str] | None = None,
) -> None:
    """The freeze and what follows it, a fresh turn's and a fork's alike: the superblock
    at ``superblock`` (a path, or ``""`` and a descriptor on it) made read-only, the new
    upper folder given the workspace root's owner and mode, ``clone`` made read-only,
    and the overlay of ``lower`` under ``layers``'s ``upper`` laid on ``workspace``. A
    step refused after the freeze thaws the superblock again and raises: the turn is
    left as it was. ``upper_to`` then takes a descriptor of the new upper folder.
    ``move_into``: the overlay goes there (``_overlay``)."""
    path, at = superblock
    _set_ro(path, True, at=at)
    try:
        root = os.stat(workspace)
        os.chown("upper", root.st_uid, root.st_gid, dir_fd=layers)
        os.chmod("upper", stat.S_IMODE(root.st_mode), dir_fd=layers)
        _mount_read_only(clone)
        _overlay(workspace, lower, layers, userxattr, move_into)
    except OSError:
        _set_ro(path, False, at=at)
        raise
    if upper_to is not None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        with suppress(OSError):  # no listing of it: no file is marked
            upper_to(os.open("upper", flags, dir_fd=layers))


def freeze_workspace(
    workspace: str,
    size: int,
    inodes: int,
    *,
    userxattr: bool,
    upper_to: Callable[[int], None] | None = None,
) -> int:
    """Freeze the tmpfs at ``workspace`` and lay the overlay on it; return the clone.

    ``size`` and ``inodes`` bound the new upper layer (``inodes`` 0: the kernel's
    default); ``userxattr``: the server is not in the initial user namespace.
    The returned descriptor (close-on-exec) is a detached, read-only mount of
    the frozen tmpfs. Raises ``OSError`` (``EBUSY``: a file is open for writing;
    ``EOPNOTSUPP``: the workspace is no tmpfs, e.g. frozen already) and then
    leaves the workspace as it was. ``upper_to`` takes a descriptor of the new
    upper layer's folder (the caller's to close), once the overlay is laid: the
    file worker lists it, so a snapshot marks the files the frozen layer's.
    """
    if filesystem_type(workspace) != TMPFS_MAGIC:
        raise OSError(
            errno.EOPNOTSUPP,
            f"{workspace} is not the sandbox's own tmpfs (frozen already, or an overlay)",
        )
    layers = _upper_tmpfs(size, inodes)
    clone = -1
    try:
        clone = _lowerfs.syscall(
            _SYS_OPEN_TREE, "open_tree", ctypes.c_int(_AT_FDCWD),
            ctypes.c_char_p(workspace.encode()), ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
        )  # fmt: skip
        superblock = (workspace, _AT_FDCWD)
        _freeze_and_lay(workspace, superblock, clone, clone, layers, userxattr, upper_to)
    except OSError:
        _close(clone)
        raise
    finally:
        _close(layers)
    return clone


def fstatfs_type(fd: int) -> int:
    """``fstatfs``'s ``f_type`` of the filesystem ``fd`` is on."""
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    _sys.check(_sys.libc().fstatfs(ctypes.c_int(fd), buffer), "fstatfs")
    return int(struct.unpack_from("=l", buffer.raw)[0])


def freeze_fork(
    workspace: str,
    upper: int,
    size: int,
    inodes: int,
    *,
    userxattr: bool,
    upper_to: Callable[[int], None] | None = None,
    held: int = -1,
    lowers: list[int] | None = None,
    move_into: tuple[int, str] | None = None,
) -> int:
    """Freeze a fork's own upper layer in place (a turn opened on a snapshot's layers,
    whose overlay ``_lowerfs`` laid at hello) and lay a new overlay on it; return the
    clone of that layer alone.

    ``upper``: the hello's descriptor of the overlay's upper folder, on the workspace's
    tmpfs (which the overlay covers). As ``freeze_workspace`` does for a fresh turn: a
    clone of that folder (``open_tree`` by descriptor, read-only), the tmpfs's superblock
    made read-only (``EBUSY`` while a file is open for writing; nothing has changed then),
    and the turn writes on in a new overlay on that layer over the old overlay's lower
    layers (``lowers``), or, without them, on a clone of the old overlay, read-only from
    then on (the kernel's stacking depth of 2 allows it: the old one lies on plain
    layers). The host lays its own forks' overlays on the stack
    ``[this layer, the layers below]``, flattened, with the same attribute mode
    (``userxattr`` or ``trusted.*``): the layer's whiteouts and opaque folders mean
    there what they meant here. Raises ``OSError`` and leaves the workspace as it was.

    ``held``: the workspace tmpfs's detached original (``_heldfs``; an ordinary user's
    fork), or -1. Where given, the layer is cloned from it (its ``upper`` folder, checked
    to be ``upper``'s): the kernel clones again, in another mount namespace (a fork of
    this fork's, in its own user namespace), only what comes of an ``fsmount``, never a
    clone of a mount attached here.

    ``lowers``: the old overlay's lower layers (``O_PATH`` descriptors, top first, kept
    from hello: ``_lowerfs.overlay_workspace(sources_to=)``). Where given, the new overlay
    lies on the frozen layer over them, flat, rather than on a clone of the old overlay:
    a nested overlay shows every file of its lower overlay on one device, so files of
    two layers may share an inode number there, and a capture of the turn would take
    them for hard links of each other.

    ``move_into``: a mount namespace's descriptor and the workspace's path there, where the
    overlay at ``workspace`` (this namespace's) is bound (a Docker fork as root: the host
    laid its overlay in a frame of its own, ``docker._cow``, and binds it into the
    container). The new overlay is made here, on this namespace's layers, and moved onto
    that path there (``docker._freeze.freeze_fork_layer``); this process is in that
    namespace from then on.
    """
    if filesystem_type(workspace) != OVERLAYFS_MAGIC or fstatfs_type(upper) != TMPFS_MAGIC:
        raise OSError(errno.EOPNOTSUPP, f"{workspace} is not a fork's overlay on its own tmpfs")
    if os.fstatvfs(upper).f_flag & os.ST_RDONLY:
        raise OSError(errno.EOPNOTSUPP, "the fork's upper layer is frozen already")
    layers = _upper_tmpfs(size, inodes)
    clone = below = -1
    try:
        clone = _upper_clone(upper, held)
        if not lowers:
            below = _lowerfs.syscall(
                _SYS_OPEN_TREE, "open_tree (the overlay)", ctypes.c_int(_AT_FDCWD),
                ctypes.c_char_p(workspace.encode()),
                ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
            )  # fmt: skip
        # fspick takes a mount's root only: the clone's is the upper folder, on the tmpfs.
        lower = [clone, *lowers] if lowers else below
        superblock = ("", clone)
        _freeze_and_lay(workspace, superblock, clone, lower, layers, userxattr, upper_to, move_into)
    except OSError:
        _close(clone)
        raise
    finally:
        _close(layers, below)
    return clone


def _upper_clone(upper: int, held: int) -> int:
    """A detached clone of the fork's upper folder ``upper``: by that descriptor, or from
    the held original of its tmpfs (``held``), at the folder the overlay took at hello."""
    if held < 0:
        flags = _OPEN_TREE_CLONE | _AT_EMPTY_PATH | os.O_CLOEXEC
        return _lowerfs.syscall(
            _SYS_OPEN_TREE, "open_tree (the upper layer)", ctypes.c_int(upper),
            ctypes.c_char_p(b""), ctypes.c_uint(flags),
        )  # fmt: skip
    name = f"{_lowerfs.LAYERS}/upper".encode()
    clone = _lowerfs.syscall(
        _SYS_OPEN_TREE, "open_tree (the upper layer, held)", ctypes.c_int(held),
        ctypes.c_char_p(name),
        ctypes.c_uint(_OPEN_TREE_CLONE | _AT_SYMLINK_NOFOLLOW | os.O_CLOEXEC),
    )  # fmt: skip
    mine, theirs = os.fstat(clone), os.fstat(upper)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        _close(clone)
        raise OSError(errno.EOPNOTSUPP, "the held tmpfs is not the fork's upper layer's")
    return clone


def thaw_unlaid(workspace: str) -> bool:
    """Thaw the tmpfs at ``workspace`` where a freeze stopped between its steps (a host's
    child killed at its timeout: nothing could undo them) and left it read-only with no
    overlay above it; whether it was. Where the overlay was laid, the workspace is the
    overlay and the turn writes on in it: nothing changes.
    """
    if filesystem_type(workspace) != TMPFS_MAGIC:
        return False
    if not os.statvfs(workspace).f_flag & os.ST_RDONLY:
        return False
    _set_ro(workspace, False)
    return True


def thaw_fork_layer(upper: int) -> bool:
    """Thaw the tmpfs the fork's upper folder ``upper`` lies on, where a freeze of it
    (``freeze_fork``) stopped after the freeze and before its new overlay was laid (a
    host's child killed at its timeout); whether it was frozen. The caller knows the
    overlay was not laid (the turn writes on in the old one, on this tmpfs)."""
    if not os.fstatvfs(upper).f_flag & os.ST_RDONLY:
        return False
    clone = _upper_clone(upper, -1)  # fspick takes a mount's root: the clone's is the folder
    try:
        _set_ro("", False, at=clone)
    finally:
        _close(clone)
    return True


def refused(code: int, message: str) -> dict[str, Any]:
    """A freeze's answer that it was not made: the errno's name and why."""
    return {"error": {"errno": errno.errorcode.get(code, "EIO"), "message": message}}


def not_here(config: Hello, plan: LaunchPlan, path_map: dict[str, str]) -> dict[str, Any] | None:
    """A freeze's refusal where the workspace is not this sandbox's own tmpfs alone (None:
    it is): mapped from the host, or holding the writable root's layers."""
    workspace = map_path(config.workspace, path_map)
    if not plan.confine or workspace != config.workspace:
        why = "the workspace is a host folder here, not the sandbox's own tmpfs"
        return refused(errno.EOPNOTSUPP, why)
    if config.writable_root:
        return refused(errno.EOPNOTSUPP, "the writable root's layers live in the workspace's tmpfs")
    return None


def prepared(config: Hello, plan: LaunchPlan, path_map: dict[str, str]) -> dict[str, Any]:
    """The answer to a ``prepare``: where the host freezes the workspace itself (Docker's:
    the server cannot reconfigure a tmpfs of the engine's), what it needs, or the refusal.

    Nothing changes here; the host then runs ``freeze_workspace`` in the server's mount
    namespace, on ``workspace``, bounding the upper layer's inodes by ``inodes``.
    """
    refusal = not_here(config, plan, path_map)
    if refusal is not None:
        return refusal
    return {"workspace": config.workspace, "inodes": config.limits["workspace_inodes"]}


def answer(
    config: Hello,
    plan: LaunchPlan,
    path_map: dict[str, str],
    upper_bytes: int,
    frozen: Callable[[int], None],
    *,
    upper_to: Callable[[int], None] | None = None,
    held: int = -1,
    held_only: bool = False,
    fork_upper: int = -1,
    fork_lowers: list[int] | None = None,
) -> dict[str, Any]:
    """The answer to a ``freeze``: the clone's number, device and inode, or the refusal.

    ``fork_upper``: the upper folder of the overlay laid at hello on the host's stack of
    layers, where the host asked to stack (``Freeze.stack``): that layer alone is frozen
    and handed over (``freeze_fork``); -1 (not such a fork, or frozen already):
    ``EOPNOTSUPP``. ``fork_lowers``: the layers that overlay lies on (``freeze_fork``).

    ``held``: the workspace tmpfs's detached original (``_heldfs``), or -1. Where the
    server holds it, that is what the host gets (made read-only too): a fork's server
    in another user namespace can clone it, as it cannot an ``open_tree`` clone.
    ``held_only``: the host takes nothing else (``EOPNOTSUPP`` where there is none).

    ``frozen`` takes the clone once it is made (the server holds it until the host
    took it, and makes again what copied the old view). ``EOPNOTSUPP`` where the
    workspace is not this sandbox's own tmpfs (mapped from the host, frozen
    already, opened from a snapshot) or holds the writable root's layers, which
    would freeze with it; ``EBUSY`` where a file is open for writing; ``EPERM``
    and the like where the kernel refuses a step (no capability, as in a Docker
    container). The host then copies the files instead.
    """
    refusal = not_here(config, plan, path_map)
    if refusal is not None:
        return refusal
    if held_only and held < 0:
        why = "the server holds no detached original of the workspace's tmpfs to hand over"
        return refused(errno.EOPNOTSUPP, why)
    userxattr = not _lowerfs.in_initial_userns()
    if fork_upper >= 0:
        try:
            clone = freeze_fork(
                config.workspace,
                fork_upper,
                upper_bytes,
                config.limits["workspace_inodes"],
                userxattr=userxattr,
                upper_to=upper_to,
                held=held,
                lowers=fork_lowers,
            )
        except OSError as exc:
            return refused(exc.errno or errno.EIO, str(exc))
        frozen(clone)
        st = os.fstat(clone)
        return {"fd": clone, "dev": st.st_dev, "ino": st.st_ino, "userxattr": userxattr}
    try:
        clone = freeze_workspace(
            config.workspace,
            upper_bytes,
            config.limits["workspace_inodes"],
            userxattr=userxattr,
            upper_to=upper_to,
        )
    except OSError as exc:
        return refused(exc.errno or errno.EIO, str(exc))
    if held >= 0:
        # The overlay holds its own clone: the host gets the original, read-only as well.
        _close(clone)
        clone = held
        with suppress(OSError):  # the superblock is read-only: every mount of it refuses
            _mount_read_only(clone)
    frozen(clone)
    st = os.fstat(clone)
    return {"fd": clone, "dev": st.st_dev, "ino": st.st_ino}


def release(held: set[int], fd: int) -> dict[str, Any]:
    """Close the server's copy ``fd`` of a clone the host took (``EBADF`` if none)."""
    if fd not in held:
        return refused(errno.EBADF, f"no frozen clone is held as descriptor {fd}")
    held.discard(fd)
    os.close(fd)
    return {}
