"""Each call's own user namespace: who a call is, and what it holds (stdlib only, Python 3.8+).

A call's init (see ``_launch``) enters a user namespace of its own before it
installs the seccomp filter, and the call runs in it as uid and gid 65534:

- **No capability anywhere.** The namespaces the call lives in (its PID and
  mount namespace, the sandbox's network and IPC ones) belong to the server's
  user namespace (or the host's, as root); a process in a child namespace holds
  no capability over them, whatever it holds in its own. In its own namespace
  init then empties every set (bounding, ambient, inheritable, permitted,
  effective) and locks the securebits, so no exec can give any back.
- **A budget of its own.** Since Linux 5.14 ``RLIMIT_NPROC`` counts the
  processes of one uid *in one user namespace*: the call's count holds the
  call's own processes and nothing else, however many turns run beside it. The
  namespace is made while init's limit is still the server's (unlimited as
  root), so the levels above never refuse a fork on the call's behalf.
- **Who it is on the host.** The namespace maps 65534 to one host identity:
  as root, the host uid and gid the server names, which the host leased for
  this turn alone (``sandbox/_uids``); as an ordinary user, the server's own,
  which is the host user's (the only id an unprivileged namespace may map).
  The inner id is 65534, 0 under ``root_identity``, or the user an exec names
  (``Turn.exec(user=)``): whichever it is, it is the one id mapped, and always
  to that same host identity, so it changes what the call sees, never what it
  can reach.
- **Its files are its own.** With a host identity of the turn's own, the call
  creates files with umask 007: another turn's uid, neither owner nor group,
  reads nothing it left in a shared writable mount, while a folder's set-gid
  bit still shares them with the folder's group (the host's users).

Init is not dumpable, and its memory belongs to the namespace it was started
in, where the call holds nothing: ``/proc/1`` is closed to the call.
"""

from __future__ import annotations

import _socket  # socket's C type: the socket module would import enum (see _lean)
import ctypes
import errno
import os
import resource
import struct

from ._lean import suppress
from ._sys import PR_SET_DUMPABLE, capget, capset, check, libc, prctl

__all__ = [
    "CALL_ID",
    "MAP_FDS",
    "MAP_IDS",
    "MAP_REQUEST",
    "TURN_UMASK",
    "enter_own_namespace",
    "give_up_capabilities",
    "lock_capabilities",
    "map_ids",
    "warm",
]

#: The uid and gid a call has inside its own user namespace.
CALL_ID = 65534
#: The calls' umask when their host identity is their turn's own: nothing for "other".
TURN_UMASK = 0o007

CLONE_NEWUSER = 0x10000000
CAP_SETPCAP = 8
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and SECBIT_NO_CAP_AMBIENT_RAISE, each with its lock,
# and SECBIT_KEEP_CAPS locked off: uid 0 (if ever reached) and exec grant nothing.
SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
#: A map request to the zygote: the letter, then the inner uid and gid; with it (SCM_RIGHTS)
#: the asking process's ``/proc`` directory and the write end of the pipe for the answer.
MAP_REQUEST = b"U"
MAP_IDS = struct.Struct("!II")
MAP_FDS = struct.Struct("ii")


#: The highest capability this kernel knows (``warm``): read once, not by every call's init.
_last_cap_known: int | None = None


def warm() -> None:
    """Resolve every libc function used here, and read the highest capability, once,
    before the server forks."""
    global _last_cap_known  # noqa: PLW0603 - a kernel constant, inherited by every fork
    for name in ("unshare", "prctl", "capset", "capget"):
        getattr(libc(), name)
    _last_cap_known = _read_last_cap()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _last_cap() -> int:
    return _read_last_cap() if _last_cap_known is None else _last_cap_known


def _read_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


def _map_from_outside(  # noqa: PLR0917 - plain values across a fork
    init: int, uid: int, gid: int, go: int, done: int, inner: int, inner_gid: int
) -> None:
    """The mapper (a child of init, still in the parent namespace): map init's ids, say so."""
    code = 1
    try:
        if os.read(go, 1) == b"x":
            _write(f"/proc/{init}/uid_map", f"{inner} {uid} 1\n")
            _write(f"/proc/{init}/gid_map", f"{inner_gid} {gid} 1\n")
            os.write(done, b"x")
            code = 0
    except BaseException as exc:
        with suppress(OSError):
            os.write(done, f"E{exc}".encode(errors="replace"))
    finally:
        os._exit(code)


def enter_own_namespace(
    host_uid: int | None,
    host_gid: int | None,
    inner: int = CALL_ID,
    inner_gid: int | None = None,
    *,
    mapper: int | None = None,
) -> None:
    """Move this process (a call's init) into a new user namespace as ``inner``, holding nothing.

    ``host_uid``/``host_gid``: the host identity to map to (root); None maps
    this process's own (an ordinary user's server). ``inner``: the uid inside,
    ``CALL_ID`` or, for ``Policy.root_identity``, 0 (a root that holds no
    capability: the sets are emptied and the securebits locked all the same)
    or the uid of the user an exec names (``Turn.exec(user=)``); ``inner_gid``
    the gid inside (``inner`` when None). Whichever they are, they map to the
    same one host identity: the inner ids change what the call *sees* (its
    uid, ``whoami``, the owner ``stat`` shows), never what it can reach.
    ``mapper``: a call's init passes the zygote's end of its map socket
    (``_zygote``), and the zygote, which holds the same capabilities in the
    parent namespace, writes the maps; otherwise (the probe, the file worker)
    a forked child of this process writes them. Raises ``OSError`` if any step
    fails; the process is then unusable for a call.
    """
    inner_gid = inner if inner_gid is None else inner_gid
    if host_uid is not None:
        os.umask(TURN_UMASK)
    uid = os.geteuid() if host_uid is None else host_uid
    gid = os.getegid() if host_gid is None else host_gid
    # The namespace's parent levels count forks against the limit init has when it makes it.
    with suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    # The mapper opens this process's uid_map: a process the server (not dumpable) forked has
    # its /proc owned by a root the mapper may not be (Docker's, which no namespace maps).
    # Dumpable again until the maps are written; it is not from the end of this on.
    prctl(PR_SET_DUMPABLE, 1)
    # Only a process left in the parent namespace, with our capabilities there, may map any id
    # but its own; so another process writes the maps. The namespace is then owned by the
    # server's uid, which no call and no other host user has.
    if mapper is None:
        answer = _unshare_mapped_by_child(uid, gid, inner, inner_gid)
    else:
        answer = _unshare_mapped_by(mapper, inner, inner_gid)
    if answer != b"x":
        raise OSError(f"cannot map the call's ids: {answer[1:].decode(errors='replace')}")
    # The creator holds every capability in the new namespace until it gives them up below.
    with suppress(OSError):
        os.setgroups([])  # refused where the sandbox's own namespace denies setgroups
    os.setresgid(inner_gid, inner_gid, inner_gid)
    os.setresuid(inner, inner, inner)
    give_up_capabilities()
    prctl(PR_SET_DUMPABLE, 0)


def _unshare_mapped_by_child(uid: int, gid: int, inner: int, inner_gid: int) -> bytes:
    """Enter a new user namespace and have a forked child of ours map it; its answer."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    me = os.getpid()
    mapper = os.fork()
    if mapper == 0:
        os.close(go_w)
        os.close(done_r)
        _map_from_outside(me, uid, gid, go_r, done_w, inner, inner_gid)
    os.close(go_r)
    os.close(done_w)
    try:
        check(libc().unshare(ctypes.c_int(CLONE_NEWUSER)), "unshare(CLONE_NEWUSER)")
        os.write(go_w, b"x")
        return os.read(done_r, 4096)
    finally:
        os.close(go_w)
        os.close(done_r)
        os.waitpid(mapper, 0)


def _unshare_mapped_by(mapper: int, inner: int, inner_gid: int) -> bytes:
    """Enter a new user namespace and have the zygote map it, over ``mapper``; its answer.

    A fork of this process just to write two files would copy its page tables and
    then fault in every page either side touches: about a millisecond of CPU per
    call. The request carries this process's ``/proc`` directory (the zygote may
    not see this process under the same pid) and the end of a pipe for the answer.
    """
    proc = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    done_r, done_w = os.pipe()
    try:
        check(libc().unshare(ctypes.c_int(CLONE_NEWUSER)), "unshare(CLONE_NEWUSER)")
        message = MAP_REQUEST + MAP_IDS.pack(inner, inner_gid)
        rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, MAP_FDS.pack(proc, done_w))
        sock = _socket.socket(fileno=os.dup(mapper))
        try:
            sock.sendmsg([message], [rights])
        finally:
            sock.close()
        os.close(done_w)
        done_w = -1
        return os.read(done_r, 4096)
    finally:
        for fd in (proc, done_r, done_w):
            if fd >= 0:
                os.close(fd)


def map_ids(proc: int, uid: int, gid: int, inner: int, inner_gid: int) -> None:
    """Map ``inner``/``inner_gid`` to ``uid``/``gid`` in the user namespace of the process
    whose ``/proc`` directory is open as ``proc`` (what the zygote does for each init)."""
    for name, text in (("uid_map", f"{inner} {uid} 1\n"), ("gid_map", f"{inner_gid} {gid} 1\n")):
        fd = os.open(name, os.O_WRONLY, dir_fd=proc)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def give_up_capabilities() -> None:
    """Empty every capability set (bounding and ambient too) and lock the securebits.

    What ``enter_own_namespace`` ends with. Raises ``OSError`` if a step is
    refused; the sets a process may always empty (effective, permitted,
    inheritable) are emptied even then.
    """
    try:
        _lock_capabilities()
    finally:
        capset(0, 0, 0)


def lock_capabilities() -> None:
    """Empty the ambient and bounding sets and lock the securebits, so that no change of uid
    and no exec can hand a capability back; the sets in use stay for the caller to empty.

    For a process about to take the calls' ids outside a user namespace of its own
    (``_launch._drop``): it still needs ``CAP_SETUID`` for that. Where this process
    does not hold ``CAP_SETPCAP`` (an ordinary user's unconfined server, a sandbox
    that gave it none) the kernel refuses the bounding set and the securebits to
    anyone, so there is nothing this process could give up there: that refusal
    passes. Raises ``OSError`` for any other failure, or if ``CAP_SETPCAP`` was held.
    """
    try:
        _lock_capabilities()
    except OSError as exc:
        if exc.errno != errno.EPERM or capget()[0] >> CAP_SETPCAP & 1:
            raise


def _lock_capabilities() -> None:
    # Ambient first: it needs no capability, so a refusal below leaves it empty all the same.
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(_last_cap() + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED)
