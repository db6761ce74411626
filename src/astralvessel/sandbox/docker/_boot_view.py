"""The Docker server's first code: a user namespace and the sandbox's view, then the server.

``_astralvessel_view`` runs first in the container's own process, before the
server's code, and must: capabilities gained by creating a user namespace
would be lost across an ``exec`` by a non-root uid. It makes a user
namespace mapping only our uid and gid to themselves: in it the server may
create the PID and mount namespaces of each call; outside it, it holds
nothing. Then it builds the sandbox's view, as bubblewrap does: a read-only
root on a fresh tmpfs holding only the image's system dirs, /proc, a minimal
/dev and the turn's binds, and pivots into it, so the image's /var, /home,
/tmp, /sys and Docker's /dev/mqueue are not there. If the kernel refuses the
namespace, the server's own probe reports the PID namespace as missing and
the host refuses the turn unless it relaxed process isolation.

The function is never run from here: ``_bootstrap`` sends its source as
text in the server's ``python -c`` (``_spec.server_argv``), so it is standard
library only, runs on any Python from 3.8, and keeps its types in comments
(an annotation would be evaluated there). The numbers it names
(``SENT_NUMBERS``) are defined once, where the server or the seccomp lists
use them too; this module imports them for the linters and the type checker,
and ``_bootstrap`` writes each one's value in its name's place.
"""

from __future__ import annotations

from .._seccomp._abi import Arch, syscall_number
from ..server._sys import (
    CLONE_NEWNS,
    MNT_DETACH,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
)
from ..server._userns import CLONE_NEWUSER

# For the type comments only (ruff does not read them): the function is sent alone, and
# imports what it uses itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence  # noqa: F401

#: The descriptor on which the view leaves the container's memory group's count of OOM
#: kills, for the server (``ServerOptions.memory_events``): above any the server opens.
#: The function's text names it, and ``_bootstrap`` writes the number in its place.
MEMORY_EVENTS_FD = 250
#: Where it leaves the same group's limit (v1's ``memory.stat``, v2's ``memory.max``), so
#: the note of a call the kernel stopped states the limit the kernel applied.
MEMORY_LIMIT_FD = 251


def _syscall(name: str, arch: Arch) -> int:
    number = syscall_number(name, arch)
    if number is None:
        raise LookupError(f"no {name} on {arch}")
    return number


PIVOT_ROOT_X86_64 = _syscall("pivot_root", "x86_64")
PIVOT_ROOT_AARCH64 = _syscall("pivot_root", "aarch64")

#: Every module-level name ``_astralvessel_view`` uses: the text sent carries their values.
SENT_NUMBERS = (
    "MEMORY_EVENTS_FD",
    "MEMORY_LIMIT_FD",
    "CLONE_NEWUSER",
    "CLONE_NEWNS",
    "MNT_DETACH",
    "MS_BIND",
    "MS_NOATIME",
    "MS_NODEV",
    "MS_NODIRATIME",
    "MS_NOEXEC",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_RDONLY",
    "MS_REC",
    "MS_RELATIME",
    "MS_REMOUNT",
    "PIVOT_ROOT_X86_64",
    "PIVOT_ROOT_AARCH64",
)


def _astralvessel_view(binds, system_dirs, root, workdir, root_dirs=()):  # noqa: PLR0912, PLR0915
    # type: (Sequence[str], Sequence[str], str, str, Sequence[str]) -> None
    import ctypes
    import os
    import sys

    # Each turn is a uid of its own: what a call writes is closed to other turns' uids.
    os.umask(0o007)
    # The container's memory group counts the kernel's OOM kills and holds its limit; the
    # view leaves /sys out, so the server reads them on descriptors kept at numbers of its
    # own (MEMORY_EVENTS_FD, MEMORY_LIMIT_FD): cgroup v1's files first, then v2's.
    for names, number in (
        (("memory/memory.oom_control", "memory.events"), MEMORY_EVENTS_FD),
        (("memory/memory.stat", "memory.max"), MEMORY_LIMIT_FD),
    ):
        for name in names:
            try:
                opened = os.open("/sys/fs/cgroup/" + name, os.O_RDONLY)
            except OSError:
                continue
            try:  # noqa: SIM105 - contextlib would load in every server
                os.dup2(opened, number, inheritable=False)
            except OSError:
                pass  # open_files at or under the number: calls' notes then come without it
            os.close(opened)
            break
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result, what):  # type: (int, str) -> None
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    def mount(src, dst, kind, flags, data=None):  # type: (str | None, str, str | None, int, str | None) -> None
        check(
            libc.mount(
                src and src.encode(),
                dst.encode(),
                kind and kind.encode(),
                ctypes.c_ulong(flags),
                data and data.encode(),
            ),
            "mount " + dst,
        )

    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(ctypes.c_int(CLONE_NEWUSER)) != 0:
        sys.stderr.write(
            f"astralvessel: cannot create a user namespace: {os.strerror(ctypes.get_errno())}\n"
        )
        return
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open("/proc/self/" + name, "w") as handle:
            handle.write(text)
    check(libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")

    def mkdirs(path):  # type: (str) -> None
        # Mount points and the folders above them are 0755, as bubblewrap and nsjail
        # make them: the umask is for what calls write, not for the view's skeleton.
        if not os.path.isdir(path):
            mkdirs(os.path.dirname(path))
            os.mkdir(path)
            os.chmod(path, 0o755)  # noqa: S103 - read-only mount points, as said

    def bind(path, restrict=False):  # type: (str, bool) -> None
        target = root + path
        if os.path.isdir(path):
            mkdirs(target)
        else:
            mkdirs(os.path.dirname(target))
            open(target, "a").close()
        mount(path, target, None, MS_BIND | MS_REC)
        if restrict:
            # Docker cannot make a bind nosuid or nodev; add both, keeping the flags
            # the user namespace may not change (read-only, noexec, atime).
            kept = os.statvfs(target).f_flag
            flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
            for st, ms in (
                (os.ST_RDONLY, MS_RDONLY),
                (os.ST_NOEXEC, MS_NOEXEC),
                (os.ST_NOATIME, MS_NOATIME),
                (os.ST_NODIRATIME, MS_NODIRATIME),
                (os.ST_RELATIME, MS_RELATIME),
            ):
                if kept & st:
                    flags |= ms
            mount(None, target, None, flags)

    def etc_view():  # type: () -> None
        # The image's /etc entry by entry on a tmpfs of its own, with copies of the engine's
        # hostname, hosts and resolv.conf: the engine binds those from
        # /var/lib/docker/containers/ID, a path mountinfo would show, and a user namespace
        # may neither bind /etc without them nor unmount them.
        # It runs at every turn's start, for some 70 entries: each entry's type comes from
        # the one scandir, not a stat or three, and its mount point is made directly (the
        # bind hides that point's mode).
        os.mkdir(root + "/etc")
        mount("tmpfs", root + "/etc", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=256k")
        with os.scandir("/etc") as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            path, target = entry.path, root + entry.path
            if entry.name in ("hostname", "hosts", "resolv.conf") and entry.is_file():
                with open(path, "rb") as src, open(target, "wb") as dst:
                    dst.write(src.read(65536))
                os.chmod(target, 0o644)
            elif entry.is_symlink():
                os.symlink(os.readlink(path), target)
            elif entry.is_dir():
                os.mkdir(target)
                mount(path, target, None, MS_BIND | MS_REC)
            elif entry.is_file():
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                mount(path, target, None, MS_BIND | MS_REC)
        mount(None, root + "/etc", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    for path in system_dirs:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif path == "/etc":
            etc_view()
        elif os.path.isdir(path):
            bind(path)

    def copy_dirs(path, depth=0):  # type: (str, int) -> None
        # The image's folders and links under ``path`` (its /run: a few empty folders),
        # made on the view's tmpfs, where a bind's mount point can then be made too.
        os.mkdir(root + path)
        os.chmod(root + path, os.lstat(path).st_mode & 0o1777)
        try:
            names = sorted(os.listdir(path))[:256] if depth < 8 else []
        except OSError:
            names = []  # the host's egress folder, say: only its mount point is wanted
        for name in names:
            inner = path + "/" + name
            if os.path.islink(inner):
                os.symlink(os.readlink(inner), root + inner)
            elif os.path.isdir(inner):
                copy_dirs(inner, depth + 1)

    # A writable root (Policy.writable_root): the image's /opt, /var, ... or empty ones,
    # which the server then covers with the turn's layers. One that holds a bind of the
    # view (/run holds /run/egress) is copied instead: the image's own is read-only, so
    # no mount point could be made in it, and a bind of it would carry the container's
    # mount below it along, locked (made outside this user namespace), on which the
    # kernel refuses the server's overlay.
    for path in root_dirs:
        if any(b.startswith(path + "/") for b in binds) and os.path.isdir(path):
            copy_dirs(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            bind(path)
        elif not os.path.lexists(path):
            os.mkdir(root + path)
    bind("/proc")
    os.mkdir(root + "/dev")
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists("/dev/" + name):
            bind("/dev/" + name)
    for name, link in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(link, root + "/dev/" + name)
    mount(None, root + "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    for path in binds:
        bind(path, restrict=True)
    os.mkdir(root + "/.old-root")
    check(
        libc.syscall(
            PIVOT_ROOT_X86_64 if os.uname().machine == "x86_64" else PIVOT_ROOT_AARCH64,
            root.encode(),
            (root + "/.old-root").encode(),
        ),
        "pivot_root",
    )
    os.chdir("/")
    check(libc.umount2(b"/.old-root", MNT_DETACH), "umount old root")
    os.rmdir("/.old-root")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(workdir)
