"""Frozen layers made on the host, as a sandbox's server makes one of its workspace.

A tmpfs is made with the new mount API and never attached anywhere: filled
through its mount's descriptor, then cloned (``open_tree(OPEN_TREE_CLONE)``,
what the server hands the host) and its superblock made read-only
(``fspick`` + ``ro`` + reconfigure). Root only: the tests that use it skip
otherwise, but ``layer_of_another_namespace``, which any user may make.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

OPEN_TREE, FSOPEN, FSCONFIG, FSMOUNT, FSPICK = 428, 430, 431, 432, 433
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
AT_EMPTY_PATH = 0x1000
FSPICK_EMPTY_PATH = 8
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING = 0, 1
FSCONFIG_CMD_CREATE, FSCONFIG_CMD_RECONFIGURE = 6, 7
CLOEXEC = 1  # FSOPEN_CLOEXEC, FSMOUNT_CLOEXEC, FSPICK_CLOEXEC
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000


def _call(number: int, *args: object) -> int:
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def writable_tmpfs() -> int:
    """A detached mount of a new tmpfs, writable: its descriptor."""
    context = _call(FSOPEN, b"tmpfs", CLOEXEC)
    try:
        _call(FSCONFIG, context, FSCONFIG_SET_STRING, b"mode", b"0755", 0)
        _call(FSCONFIG, context, FSCONFIG_CMD_CREATE, None, None, 0)
        return _call(FSMOUNT, context, CLOEXEC, 0)
    finally:
        os.close(context)


def freeze(mount: int) -> int:
    """A detached clone of ``mount``, its superblock made read-only: a frozen layer's fd."""
    clone = _call(OPEN_TREE, mount, b"", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH)
    picked = _call(FSPICK, clone, b"", FSPICK_EMPTY_PATH | CLOEXEC)
    try:
        _call(FSCONFIG, picked, FSCONFIG_SET_FLAG, b"ro", None, 0)
        _call(FSCONFIG, picked, FSCONFIG_CMD_RECONFIGURE, None, None, 0)
    finally:
        os.close(picked)
    return clone


def frozen_layer(tree: Path) -> int:
    """A frozen layer holding a copy of ``tree`` (``cp -a``: modes, links and hard links
    kept): the descriptor the host would receive from a sandbox's server."""
    mount = writable_tmpfs()
    try:
        target = f"/proc/self/fd/{mount}/"
        subprocess.run(["cp", "-a", f"{tree}/.", target], check=True, pass_fds=(mount,))
        return freeze(mount)
    finally:
        os.close(mount)


def _unshare(flags: int) -> None:
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _what_this_process_holds() -> str:
    """What the kernel checks before it makes namespaces: threads, filters, mounts."""
    status = Path("/proc/self/status").read_text(encoding="ascii", errors="replace")
    wanted = ("Threads:", "Seccomp:", "NoNewPrivs:", "CapEff:")
    lines = [" ".join(line.split()) for line in status.splitlines() if line.startswith(wanted)]
    with open("/proc/self/mountinfo", "rb") as handle:
        mounts = handle.read().count(b"\n")
    return f"{'; '.join(lines)}; mounts {mounts}"


def _enter_own_user_namespace() -> None:
    """Enter a new user and mount namespace mapping this process's ids to themselves.

    The user namespace first, then the mount namespace in it, each its own step: a
    refusal then names which one the kernel refused, and what this process held.
    """
    uid, gid = os.getuid(), os.getgid()
    for name, flag in (("user", CLONE_NEWUSER), ("mount", CLONE_NEWNS)):
        try:
            _unshare(flag)
        except OSError as exc:
            raise OSError(
                exc.errno, f"{name} namespace: {exc.strerror} ({_what_this_process_holds()})"
            ) from None
        if flag == CLONE_NEWUSER:
            _map_ids(uid, gid)


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as handle:
            handle.write(text)


def layer_of_another_namespace(files: dict[str, bytes]) -> int:
    """A frozen layer made as a sandbox's server makes one: by a process in a user
    namespace of its own, its descriptor sent back over a socket. Any user may: root's
    tmpfs would belong to the host's user namespace, this one does not.

    The process is a new interpreter running this file, not a fork of the test runner:
    a fork runs whatever the runner's libraries registered to run in a forked child
    (CI, 3.11's whole run: every attempt's ``unshare(CLONE_NEWUSER)`` refused, EINVAL,
    which the kernel answers a process with more than one thread). A failure names
    the step and what the process held.
    """
    parent, child = socket.socketpair()
    with parent:
        with child:
            process = subprocess.run(
                [sys.executable, "-I", __file__, str(child.fileno())],
                input=json.dumps({name: data.hex() for name, data in files.items()}).encode(),
                stderr=subprocess.PIPE,
                pass_fds=(child.fileno(),),
                check=False,
            )
        parent.setblocking(False)
        try:
            message, fds, _, _ = socket.recv_fds(parent, 1000, 1)
        except BlockingIOError:
            message, fds = b"(nothing)", []
    if fds and process.returncode == 0:
        return fds[0]
    for fd in fds:
        os.close(fd)
    raise OSError(
        f"the child could not make a frozen layer: exit {process.returncode}: "
        f"{message.decode(errors='replace')} {process.stderr.decode(errors='replace')[-2000:]}"
    )


def _make_and_send(sender: socket.socket, files: dict[str, bytes]) -> None:
    """In the child: a frozen layer holding ``files``, sent over ``sender``; or the
    step that failed and why."""
    step = "enter a user namespace"
    try:
        _enter_own_user_namespace()
        step = "make the tmpfs"
        mount = writable_tmpfs()
        step = "write its files"
        for name, data in files.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=mount)
            os.write(fd, data)
            os.close(fd)
        step = "freeze it"
        frozen = freeze(mount)
        step = "send it"
        socket.send_fds(sender, [b"x"], [frozen])
    except BaseException as exc:  # said to the parent, which raises it, with the step
        with contextlib.suppress(OSError):
            sender.sendall(f"{step}: {exc!r}".encode()[:1000])
        raise


def closed(fd: int, device: int) -> bool:
    """Whether ``fd`` no longer holds the layer of ``device`` (closed, or its number reused)."""
    try:
        return os.fstat(fd).st_dev != device
    except OSError:
        return True


if __name__ == "__main__":  # the child of layer_of_another_namespace
    wanted = json.load(sys.stdin)
    with socket.socket(fileno=int(sys.argv[1])) as sender:
        _make_and_send(sender, {name: bytes.fromhex(data) for name, data in wanted.items()})
