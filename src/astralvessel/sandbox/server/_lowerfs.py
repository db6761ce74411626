"""A workspace opened from a snapshot, copy-on-write (stdlib only, Python 3.8+).

The host binds the snapshot's tree from its store read-only into the sandbox
(``workspace_lower`` of the hello); at hello, before it makes the outbox or
forks anything, the server mounts an overlay on the workspace:

- **Below**, the snapshot's tree, shared by every turn opened from it and
  never written: the bind is read-only, the overlay writes only its upper
  layer, and the bind's mount point is covered once the overlay holds it.
- **Above**, the turn's own layer, in a folder of the workspace's tmpfs that
  the overlay then covers: what a call writes, changes or removes (a copy-up,
  a whiteout) counts against the turn's ``disk_mb`` and goes with the turn.
- **Whose files.** An overlay's copy-up keeps the lower file's owner, so the
  lower files must already be the calls' host identity. As an ordinary user
  they are (the store and every turn are the user). As root the store's files
  are root's and each turn has its leased uid: the server, which holds
  ``CAP_SYS_ADMIN`` over the host's filesystems only as root, clones the bind
  as an idmapped mount (Linux 5.12; an overlay over one, 5.19) that shows the
  store's owner as the leased uid and gid, and uses the clone as the lower
  layer. Nothing on the disk changes owner.

The overlay is ``nosuid`` and ``nodev``. Where a step is refused (an older
kernel, a server without the capability) the caller reports why and the host
copies the files in instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from . import _sys
from ._lean import suppress
from ._messages import MAX_LAYERS
from ._userns import CLONE_NEWUSER

__all__ = ["LAYERS", "MAX_LAYERS", "in_initial_userns", "overlay_workspace", "syscall"]

#: The folder of the workspace's tmpfs holding the upper layer (covered by the overlay).
LAYERS = ".vessel-layers"

# The new mount API's numbers are the same on every architecture (Linux 5.2 onwards).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4


def syscall(number: int, what: str, *args: object) -> int:
    result = int(_sys.libc().syscall(ctypes.c_long(number), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _write_maps(proc: str, pid: int, uid: tuple[int, int], gid: tuple[int, int]) -> int:
    """Write ``pid``'s id maps (each ``(inside, outside)``) through ``proc``; its namespace."""
    for name, (inside, outside) in (("uid_map", uid), ("gid_map", gid)):
        fd = os.open(f"{proc}/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, f"{inside} {outside} 1\n".encode())
        finally:
            os.close(fd)
    return os.open(f"{proc}/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)


def _userns_mapping(
    outside_uid: int, outside_gid: int, inside_uid: int, inside_gid: int, scratch: str
) -> int:
    """A descriptor of a new user namespace mapping ``inside`` ids to ``outside`` ones.

    A child made for it alone enters the namespace and waits while this process
    writes the maps (as root, no ``setgroups`` denial is needed) and opens it.
    nsjail's ``/proc`` is read-only: there the maps are written through a
    ``/proc`` of the same processes mounted at ``scratch`` for the moment.
    """
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only enters the namespace and waits
        code = 0
        try:
            os.close(ready_r)
            os.close(done_w)
            code = 0 if _sys.libc().unshare(ctypes.c_int(CLONE_NEWUSER)) == 0 else 1
            os.write(ready_w, bytes([code]))
            os.read(done_r, 1)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"\0":
            raise OSError(1, "cannot make a user namespace for the idmapped lower layer")
        uid, gid = (inside_uid, outside_uid), (inside_gid, outside_gid)
        try:
            return _write_maps("/proc", pid, uid, gid)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
        os.mkdir(scratch, 0o700)
        _sys.mount("proc", scratch, "proc", _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC)
        try:
            return _write_maps(scratch, pid, uid, gid)
        finally:
            _sys.check(_sys.libc().umount2(scratch.encode(), _sys.MNT_DETACH), "umount proc")
            os.rmdir(scratch)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)


def _idmapped_clone(lower: str, target: str, uid: int, gid: int, scratch: str) -> None:
    """Attach at ``target`` a read-only clone of ``lower`` whose owner shows as uid/gid."""
    st = os.stat(lower)
    tree = syscall(
        _SYS_OPEN_TREE, "open_tree", ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(lower.encode()),
        ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC),
    )  # fmt: skip
    try:
        userns = _userns_mapping(uid, gid, st.st_uid, st.st_gid, scratch)
        try:
            flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
            attr = ctypes.create_string_buffer(struct.pack("=QQQQ", flags, 0, 0, userns), 32)
            syscall(
                _SYS_MOUNT_SETATTR, "mount_setattr (an idmapped lower layer)", ctypes.c_int(tree),
                ctypes.c_char_p(b""), ctypes.c_uint(_AT_EMPTY_PATH), attr, ctypes.c_size_t(32),
            )  # fmt: skip
        finally:
            os.close(userns)
        syscall(
            _SYS_MOVE_MOUNT, "move_mount", ctypes.c_int(tree), ctypes.c_char_p(b""),
            ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(target.encode()),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        )  # fmt: skip
    finally:
        os.close(tree)


def in_initial_userns() -> bool:
    """Whether this process is in the initial user namespace (overlays take ``trusted.*``)."""
    try:
        with open("/proc/self/uid_map", "rb") as handle:
            return handle.read().split() == [b"0", b"0", b"4294967295"]
    except OSError:
        return False


def overlay_workspace(
    workspace: str,
    lower: str | None,
    uid: int | None,
    gid: int | None,
    *,
    held: int = -1,
    below: tuple[int, ...] = (),
    movable: bool = False,
    layers: int = 0,
    sources_to: list[int] | None = None,
) -> int:
    """Mount the overlay of ``lower`` (the snapshot's bound tree) on ``workspace``, or of
    ``held`` (a frozen layer passed by descriptor, ``lower`` None; see ``_attach_held``).

    ``uid``/``gid``: the calls' host identity (None: the server's own, which
    owns the store already). Returns a descriptor of the upper layer, opened
    before the overlay covers it, for the file worker alone (close-on-exec: no
    call inherits it): a snapshot reads there which files the turn changed.
    Raises ``OSError`` when a step is refused; the workspace is then left as it
    was (its tmpfs, plus an empty layers folder). ``movable``: ``held`` is this
    server's alone (an adoption's, see ``_attach_held``). ``layers``: ``lower`` holds
    that many layers, folders ``0``, ``1``... top first (a stack: a fork of a fork
    frozen in place, ``_freeze.freeze_fork``), each idmapped as one tree would be.
    ``below``: the held layers under ``held``, top first (an ordinary user's stack, or any
    stack an adoption passed: ``movable`` then holds for each), each cloned and attached
    as ``held`` is, the overlay laid on them all.
    ``sources_to`` takes a descriptor (``O_PATH``, close-on-exec, the caller's) of each
    lower layer the overlay took, top first, once it is laid: a freeze of the turn's own
    layer lays its next overlay on that layer over these (``_freeze.freeze_fork``), flat.
    """
    if not 0 <= layers <= MAX_LAYERS or (layers and lower is None):
        raise OSError(errno.EINVAL, f"a stacked lower layer holds 1 to {MAX_LAYERS} layers")
    if below and (lower is not None or len(below) >= MAX_LAYERS):
        raise OSError(errno.EINVAL, f"a held stack holds 2 to {MAX_LAYERS} passed layers")
    folder = os.path.join(workspace, LAYERS)
    os.mkdir(folder, 0o700)
    try:
        if lower is None:
            stack = [
                _attach_held(fd, os.path.join(folder, _held_name(index)), movable=movable)
                for index, fd in enumerate((held, *below))
            ]
        else:
            stack = [os.path.join(lower, str(i)) for i in range(layers)] if layers else [lower]
        upper = _lay(workspace, folder, stack, uid, gid, sources_to=sources_to)
    except OSError:
        _undo(folder, layers, len(below))
        raise
    if lower is None:
        return upper  # its clone is in the layers folder, which the overlay covers
    # The overlay holds its layers; the bind's own mount point is covered, so the tree is
    # reached through the overlay alone.
    cover = _sys.MS_RDONLY | _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC
    _sys.mount("none", lower, "tmpfs", cover, "size=4k,mode=0555")
    return upper


def _held_name(index: int) -> str:
    """The folder of the layers folder a held layer's clone is attached at (top: ``held``)."""
    return "held" if index == 0 else f"held{index}"


def _attach_held(held: int, target: str, *, movable: bool = False) -> str:
    """Attach at ``target`` this server's own clone of the frozen layer ``held``; its path.

    The layer is a detached mount of another sandbox's tmpfs, made by ``fsmount``
    (``_heldfs``): the overlay would refuse it as it is (EPERM: its mount belongs to
    that sandbox's user namespace), and the kernel clones a detached mount in another
    mount namespace only where ``fsmount`` made it. The clone is this namespace's.

    ``movable``: ``held`` is a clone the host made for this server alone (an adopted
    warm sandbox's, as root: the host's clone of the layer it staged, which this
    namespace may not clone again): where the clone is refused, that mount itself is
    attached. Never at a hello, whose layer is shared by every fork.
    """
    if held < 0:
        raise OSError(errno.EBADF, "no lower layer was bound or passed")
    os.mkdir(target, 0o700)
    try:
        tree = syscall(
            _SYS_OPEN_TREE, "open_tree (the passed frozen layer)", ctypes.c_int(held),
            ctypes.c_char_p(b""), ctypes.c_uint(_OPEN_TREE_CLONE | _AT_EMPTY_PATH | os.O_CLOEXEC),
        )  # fmt: skip
    except OSError as exc:
        if not movable or exc.errno != errno.EINVAL:
            raise
        tree = os.dup(held)
    try:
        syscall(
            _SYS_MOVE_MOUNT, "move_mount (the passed frozen layer)", ctypes.c_int(tree),
            ctypes.c_char_p(b""), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(target.encode()),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        )  # fmt: skip
    finally:
        os.close(tree)
    return target


def _lay(
    workspace: str,
    layers: str,
    stack: list[str],
    uid: int | None,
    gid: int | None,
    *,
    sources_to: list[int] | None = None,
) -> int:
    upper = os.path.join(layers, "upper")
    work = os.path.join(layers, "work")
    os.mkdir(upper, 0o755)
    os.mkdir(work, 0o700)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    upper_fd = os.open(upper, flags)
    try:
        sources = [
            _source(layer, layers, upper, uid, gid, index=index)
            for index, layer in enumerate(stack)
        ]
        # In a user namespace the overlay's own attributes (an opaque folder, a redirect)
        # cannot be trusted.* ones: user.* on the tmpfs, hidden from calls by the overlay.
        # No redirects either way (userxattr implies it): a folder renamed is copied, so a
        # name the upper layer does not hold shows the lower layer's file of that name.
        extra = ",redirect_dir=nofollow" if in_initial_userns() else ",userxattr"
        options = f"lowerdir={':'.join(sources)},upperdir={upper},workdir={work}{extra}"
        # Before the overlay (and the bind's cover) hides their paths.
        paths = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        held = [os.open(source, paths) for source in sources] if sources_to is not None else []
        try:
            _sys.mount("overlay", workspace, "overlay", _sys.MS_NOSUID | _sys.MS_NODEV, options)
        except OSError:
            for fd in held:
                os.close(fd)
            raise
    except OSError:
        os.close(upper_fd)
        raise
    if sources_to is not None:
        sources_to.extend(held)
    return upper_fd


def _source(
    lower: str, layers: str, upper: str, uid: int | None, gid: int | None, *, index: int
) -> str:
    """The path the overlay takes ``lower`` at: itself, or an idmapped clone of it that
    shows its owner as the calls' ``uid``/``gid`` (then the upper folder is theirs too)."""
    if uid is None:
        return lower
    owner = os.stat(lower)
    group = uid if gid is None else gid
    if (owner.st_uid, owner.st_gid) == (uid, group):
        return lower
    # The store's files belong to the host's uid (a frozen layer's, to the turn's that
    # froze it: each layer of a stack its own), the calls to their leased one.
    source = os.path.join(layers, "lower" if index == 0 else f"lower{index}")
    os.mkdir(source, 0o700)
    _idmapped_clone(lower, source, uid, group, os.path.join(layers, "proc"))
    os.chown(upper, uid, group)
    return source


def _undo(layers: str, count: int = 0, below: int = 0) -> None:
    """Leave the workspace as it was: the lower clones detached, the layers folder gone."""
    clones = (
        "lower",
        *(_held_name(index) for index in range(below + 1)),
        *(f"lower{index}" for index in range(1, count)),
    )
    for name in clones:
        clone = os.path.join(layers, name)
        if os.path.ismount(clone):
            _sys.libc().umount2(clone.encode(), _sys.MNT_DETACH)
    # The overlay makes its own folders in its work folder before it may refuse (EPERM
    # over a frozen layer of another user namespace): left, the layers folder stays, the
    # server's and private, and a snapshot's listing of the workspace is refused.
    for name in ("work/work", "work/index", *clones, "upper", "work", "proc", ""):
        with suppress(OSError):  # what was never made
            os.rmdir(os.path.join(layers, name) if name else layers)
