"""A writable root for one turn: per-turn layers on the workspace's disk (stdlib only, Python 3.8+).

With ``Policy.writable_root`` the server, at hello and before it forks anything,
makes the sandbox's root writable for the turn's calls without changing a byte
of what lies below:

- **Where writes land.** Every layer lives in ``/workspace/.vessel-root``, on
  the workspace's own tmpfs, so what calls write anywhere counts against the
  one disk limit of the turn, and is gone with it. The folder is then covered
  by an empty read-only tmpfs: calls cannot reach the layers behind the
  overlays' backs.
- **Which paths.** Each root directory the host names (``SYSTEM_DIRS`` and
  ``ROOT_DIRS`` of ``Policy``) that the view shows as a
  real directory with no mount below it gets an overlay: the directory as it
  is (the host's ``/usr``, an image's ``/var``, an empty ``/opt``) read-only
  below, the turn's layer above. A directory built of mounts (bubblewrap's and
  nsjail's synthetic ``/etc``) is copied into the layer instead, as the view
  shows it. A directory that holds other mounts (``/run`` holding the egress
  proxy's socket folder, a ``/tmp`` holding the host's interpreter) gets its
  overlay too, and each mount it held is bound back on top, as it was
  (read-only stays read-only): a call can write beside ``/run/egress`` but
  neither into it nor over it (a mount point cannot be removed or renamed).
- **Who may write.** The files below belong to users the call's namespace does
  not map (host root), and no capability of a namespace reaches such files: a
  call could create nothing in ``/usr/local/lib``. So the upper layer starts
  with a copy of every directory below (mode without set-id bits), owned by
  the call's host identity: the call owns every directory of its root, may
  create, replace and remove files in it, while the files below keep their
  owner and mode and are changed only by replacing them (as pip, ``sed -i``
  and editors do).

Each call's mount namespace is a copy of the server's, so the overlays are the
turn's: what one call installs the next one finds, and no other turn sees it.
"""

from __future__ import annotations

import ctypes
import os
import stat

from . import _sys

__all__ = ["ETC_SEEDS", "LAYERS", "PAM_OTHER", "SCRATCH", "make_root_writable", "shadow_for"]

#: Scratch folders every writable root has, sticky and writable by all (made where missing).
SCRATCH = ("/tmp", "/var/tmp")  # noqa: S108 - sandbox paths
#: PAM's policy for a service with none of its own, in a writable root without /etc/pam.d:
#: root passes (pam_rootok), anyone else is refused. Without any policy PAM aborts, and
#: adduser stops at its ``chfn``. Every user of a turn is the same host identity and no call
#: can gain a privilege (``no_new_privs``), so root here is no more than the calls are.
PAM_OTHER = """\
# astralvessel's writable root: root's account tools pass, nothing else authenticates.
auth     sufficient pam_rootok.so
auth     required   pam_deny.so
account  sufficient pam_rootok.so
account  required   pam_deny.so
password sufficient pam_rootok.so
password required   pam_deny.so
session  required   pam_permit.so
"""
#: What a writable root's copied /etc gets where it has no such entry, as the account tools
#: (adduser, useradd, chfn) expect of a root: folder name -> its files (name -> text).
#: adduser copies a new home from /etc/skel (without it, from the working directory).
ETC_SEEDS: dict[str, dict[str, str]] = {"skel": {}, "pam.d": {"other": PAM_OTHER}}
#: The folder of the workspace that holds the layers (covered once they are mounted).
LAYERS = ".vessel-root"


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            field = line.split(b" ")[4].decode("utf-8", "surrogateescape")
            points.append(field.replace("\\040", " ").replace("\\011", "\t"))
    return points


def _strategy(path: str, points: list[str]) -> str | None:
    """``overlay``, ``copy`` (/etc, a directory built of mounts) or None (leave it as it is)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    if path == "/etc" and _held(path, points):
        return "copy"
    return "overlay"


def _held(path: str, points: list[str]) -> list[str]:
    """The outermost mount points below ``path``: what an overlay on it must bind back."""
    below = sorted({p for p in points if p.startswith(path + "/")})
    return [p for p in below if not any(p.startswith(q + "/") for q in below)]


def _own(path: str, uid: int | None, gid: int | None) -> None:
    if uid is not None:
        os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)


def _seed(lower: str, upper: str, held: frozenset[str] = frozenset()) -> None:
    """Give ``upper`` a directory for every directory of ``lower``, with its mode.

    Runs as the call's file identity (see ``_as_call``), so each directory is
    the call's from the start, and under umask 0, so ``mkdir`` alone sets the
    mode: one system call per directory, 15 000 for a Debian ``/usr``. The
    mount points ``held`` are skipped: their mounts are bound back over the
    overlay, and a tree behind one (an interpreter's) would cost the
    workspace's inodes for nothing.
    """
    pending = [(lower, upper)]
    while pending:
        source, target = pending.pop()
        try:
            entries = list(os.scandir(source))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode & 0o1777
            except OSError:
                continue  # gone meanwhile, or hidden from the call as from us
            if entry.path in held:
                continue
            made = os.path.join(target, entry.name)
            os.mkdir(made, mode)
            pending.append((entry.path, made))


class _as_call:
    """Create files as the call's host identity (fsuid, fsgid) and with umask 0, then restore.

    A class rather than ``contextlib.contextmanager``, whose imports every idle turn would hold.
    """

    def __init__(self, uid: int | None, gid: int | None) -> None:
        self.uid = uid
        self.gid = gid
        self.mask = 0

    def __enter__(self) -> None:
        lib = _sys.libc()
        self.mask = os.umask(0)
        if self.gid is not None:
            lib.setfsgid(ctypes.c_uint(self.gid))
        if self.uid is not None:
            lib.setfsuid(ctypes.c_uint(self.uid))

    def __exit__(self, *exc_info: object) -> None:
        lib = _sys.libc()
        if self.uid is not None:
            lib.setfsuid(ctypes.c_uint(os.geteuid()))
        if self.gid is not None:
            lib.setfsgid(ctypes.c_uint(os.getegid()))
        os.umask(self.mask)


def _copy_file(source: str, target: str) -> None:
    """shutil.copyfile without shutil: it pulls fnmatch and re into every turn's start, and
    the library may not be importable here, while the root is being remade."""
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            while chunk := os.read(src, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy(source: str, target: str) -> None:
    """Copy the tree the view shows at ``source`` (links as links) into ``target``.

    Runs as the call's file identity (see ``_as_call``): what the call could not
    read (an image's ``/etc/shadow``, a root-only file among the host's entries)
    is left out, so a copy never shows the call more than the original did.
    """
    pending = [(source, target)]
    while pending:
        here, there = pending.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            made = os.path.join(there, entry.name)
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), made)
                    continue
                mode = entry.stat().st_mode & 0o1777
                if entry.is_dir():
                    os.mkdir(made, mode)
                    pending.append((entry.path, made))
                elif entry.is_file():
                    _copy_file(entry.path, made)
                    os.chmod(made, mode)
            except OSError:
                continue


def _create(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def shadow_for(passwd: bytes) -> bytes:
    """An /etc/shadow for ``passwd``'s users: every password locked (``*``), no aging.

    What a copied /etc gets when the call could not read the original (the
    image's is root's alone) or there was none: PAM's ``pam_unix`` refuses
    root's account without root's entry, and useradd keeps a shadow entry only
    where the file exists.
    """
    names = [line.split(b":", 1)[0] for line in passwd.split(b"\n") if b":" in line]
    return b"".join(name + b":*::0:99999:7:::\n" for name in names if name)


def _seed_etc(upper: str) -> None:
    """Add ``ETC_SEEDS`` and a locked shadow to a copied /etc where it has none of them."""
    for folder, files in ETC_SEEDS.items():
        where = os.path.join(upper, folder)
        if os.path.lexists(where):
            continue
        os.mkdir(where, 0o755)
        for name, text in files.items():
            _create(os.path.join(where, name), text.encode(), 0o644)
    shadow = os.path.join(upper, "shadow")
    if not os.path.lexists(shadow):
        try:
            with open(os.path.join(upper, "passwd"), "rb") as handle:
                passwd = handle.read(1 << 20)
        except OSError:
            passwd = b""
        _create(shadow, shadow_for(passwd), 0o600)


def make_root_writable(
    paths: list[str], workspace: str, uid: int | None, gid: int | None
) -> list[str]:
    """Make the root directories ``paths`` writable for the turn's calls; return those now so.

    ``uid``/``gid``: the call's host identity (None: the server's own, which
    already is). Raises ``OSError`` when a layer cannot be made or mounted.
    """
    layers = os.path.join(workspace, LAYERS)
    # Traversable (not listable) so the seeding, as the call's identity, reaches its folders;
    # no call exists yet, and once mounted the folder is covered.
    os.mkdir(layers, 0o711)
    os.chmod(layers, 0o711)  # noqa: S103 - traversal only, and covered before any call runs
    points = _mount_points()
    done = []
    for path in paths:
        how = _strategy(path, points)
        if how is None:
            continue
        name = path.strip("/")
        upper = os.path.join(layers, "upper", name)
        os.makedirs(upper, mode=0o711)
        os.chmod(upper, stat.S_IMODE(os.stat(path).st_mode) & 0o1777)
        _own(upper, uid, gid)
        if how == "copy":
            with _as_call(uid, gid):
                _copy(path, upper)
                if path == "/etc":
                    _seed_etc(upper)
            _sys.mount(upper, path, None, _sys.MS_BIND)
        else:
            work = os.path.join(layers, "work", name)
            os.makedirs(work)
            held = _held(path, points)
            with _as_call(uid, gid):
                _seed(path, upper, frozenset(held))
            # The overlay's lower layer is the directory without the mounts it held: each
            # is bound aside first (behind the layers' cover), then back over the overlay.
            aside = []
            for number, point in enumerate(held):
                kept = os.path.join(layers, "held", name, str(number))
                os.makedirs(kept)
                _sys.mount(point, kept, None, _sys.MS_BIND | _sys.MS_REC)
                aside.append((kept, point))
            options = f"lowerdir={path},upperdir={upper},workdir={work}"
            _sys.mount("overlay", path, "overlay", _sys.MS_NOSUID | _sys.MS_NODEV, options)
            for kept, point in aside:
                _sys.mount(kept, point, None, _sys.MS_BIND | _sys.MS_REC)
        done.append(path)
    # Programs expect both scratch folders (inspect_ai's tools use /var/tmp): where the
    # root was empty there, they are made as they always are, sticky and open to all.
    with _as_call(uid, gid):
        for scratch in SCRATCH:
            if scratch not in done and os.path.dirname(scratch) not in done:
                continue  # left as it was (it holds a mount)
            if not os.path.lexists(scratch):
                os.mkdir(scratch, 0o1777)
            if not os.path.islink(scratch):
                os.chmod(scratch, 0o1777)  # noqa: S103 - what every system gives these two
    # The layers stay reachable only through the overlays.
    cover = _sys.MS_RDONLY | _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC
    _sys.mount("none", layers, "tmpfs", cover, "size=4k,mode=0555")
    return done
