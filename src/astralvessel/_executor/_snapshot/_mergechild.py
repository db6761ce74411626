"""The child that mounts a held stack's merged view (stdlib only; run as a script).

Run as ``python -I -S _mergechild.py SOCKET LAYER...`` by ``_heldmerge``, a fresh
interpreter of one thread (a forked child of the host, which runs threads, may not
make a user namespace: ``unshare`` refuses it with ``EINVAL``). ``SOCKET`` is a unix
socket's descriptor, each ``LAYER`` a held frozen layer's (a detached mount the host
holds, top first). The child makes a user and a mount namespace of its own (mapping
only the host user's ids to themselves), clones each layer there
(``open_tree(OPEN_TREE_CLONE)``: the overlay takes no mount of another namespace), and
makes their read-only overlay (lower layers only, ``userxattr``: the forks' overlays
wrote their whiteouts and opaque folders so) with the new mount API, detached,
``nosuid``, ``nodev``, ``noexec``. It sends that mount's descriptor back on ``SOCKET``
(``SCM_RIGHTS``) and exits: the mount lives as long as the host holds it.

Any refusal is sent back as one line, ``error ERRNO WHY``, and nothing is mounted.
"""

import ctypes
import errno
import os
import socket
import sys

_SYS_OPEN_TREE = 428
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_OPEN_TREE_CLONE = 1
_AT_EMPTY_PATH = 0x1000
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_FD = 5
_FSCONFIG_CMD_CREATE = 6
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_NOEXEC = 0x8

_libc = ctypes.CDLL(None, use_errno=True)


def _call(number: int, what: str, *args: object) -> int:
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _own_namespaces() -> None:
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNS)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare a user and mount namespace: {os.strerror(err)}")
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _config(fs: int, command: int, key: str | None, aux: int, what: str) -> None:
    _call(
        _SYS_FSCONFIG, what, ctypes.c_int(fs), ctypes.c_uint(command),
        ctypes.c_char_p(None if key is None else key.encode()), ctypes.c_char_p(None),
        ctypes.c_int(aux),
    )  # fmt: skip


def merged(layers: "list[int]") -> int:
    """The detached read-only overlay of ``layers`` (top first), in new namespaces."""
    _own_namespaces()
    flags = ctypes.c_uint(_OPEN_TREE_CLONE | _AT_EMPTY_PATH | os.O_CLOEXEC)
    empty = ctypes.c_char_p(b"")
    clones = [
        _call(_SYS_OPEN_TREE, "clone a held layer", ctypes.c_int(layer), empty, flags)
        for layer in layers
    ]
    fs = _call(_SYS_FSOPEN, "fsopen overlay", ctypes.c_char_p(b"overlay"), ctypes.c_uint(1))
    for clone in clones:
        _config(fs, _FSCONFIG_SET_FD, "lowerdir+", clone, "fsconfig lowerdir+")
    _config(fs, _FSCONFIG_SET_FLAG, "userxattr", 0, "fsconfig userxattr")
    _config(fs, _FSCONFIG_CMD_CREATE, None, 0, "create the stack's overlay")
    attrs = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOEXEC
    return _call(
        _SYS_FSMOUNT, "fsmount the stack's overlay", ctypes.c_int(fs), ctypes.c_uint(1),
        ctypes.c_uint(attrs),
    )  # fmt: skip


def main(argv: "list[str]") -> int:
    reply = socket.socket(fileno=int(argv[1]))
    try:
        mount = merged([int(arg) for arg in argv[2:]])
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
        reply.sendall(f"error {code} {exc}".encode()[:4000])
        return 1
    socket.send_fds(reply, [b"ok"], [mount])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
