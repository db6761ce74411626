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
import os
import socket
import subprocess
import time
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


def _enter_own_user_namespace() -> None:
    """Enter a new user and mount namespace mapping this process's ids to themselves."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as handle:
            handle.write(text)


def layer_of_another_namespace(files: dict[str, bytes]) -> int:
    """A frozen layer made as a sandbox's server makes one: by a process in a user
    namespace of its own (a child, here), its descriptor sent back over a socket. Any
    user may: root's tmpfs would belong to the host's user namespace, this one does not.

    A child that fails says at which step and why over the socket. Tried three times,
    with pauses: a child forked from the test runner failed on CI in the whole run only,
    never alone (3.10 once; 3.11 once, three attempts in a row, each EINVAL); the layer
    is the test's scaffolding, not what it tests, and a failure names every attempt's.
    """
    failures: list[str] = []
    for pause in (0.0, 0.5, 2.0):  # whatever the whole run had in hand may pass meanwhile
        time.sleep(pause)
        fd, why = _layer_from_a_child(files)
        if fd is not None:
            return fd
        failures.append(why)
    raise OSError(f"the child could not make a frozen layer: {failures}")


def _layer_from_a_child(files: dict[str, bytes]) -> tuple[int | None, str]:
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child makes the layer and exits
        code = 1
        step = "start"
        try:
            parent.close()
            step = "enter a user namespace"
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
            socket.send_fds(child, [b"x"], [frozen])
            code = 0
        except BaseException as exc:  # said to the parent, which raises it, with the step
            with contextlib.suppress(OSError):
                child.sendall(f"{step}: {exc!r}".encode()[:1000])
        finally:
            os._exit(code)
    child.close()
    try:
        message, fds, _, _ = socket.recv_fds(parent, 1000, 1)
    finally:
        parent.close()
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if fds and code == 0:
        return fds[0], ""
    for fd in fds:
        os.close(fd)
    return None, f"exit {code}: {message.decode(errors='replace')}"


def closed(fd: int, device: int) -> bool:
    """Whether ``fd`` no longer holds the layer of ``device`` (closed, or its number reused)."""
    try:
        return os.fstat(fd).st_dev != device
    except OSError:
        return True
