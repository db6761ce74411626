"""An ordinary user's merged view of a held stack: a read-only overlay of the layers,
made in a user and mount namespace of its own and held by descriptor.

Root mounts a stack's merged view in the store (``_store.mount_stack``). An ordinary
user's host cannot mount in its own namespace, and its layers are detached mounts it
holds (``Tree.held_layer``). A child (``_mergechild``, a fresh interpreter: the host
runs threads, and a user namespace is refused a process of more than one) makes a user
namespace mapping the host user alone, clones each layer there and lays their overlay,
detached, and passes its descriptor back over a socket pair. The host reads it through
``/proc/self/fd/N`` as any held layer: its listing, digests, ``save()`` and copies
need nothing else. The descriptor is checked before use: a read-only folder on an
overlay, else refused and closed.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

from ...sandbox.server._freeze import OVERLAYFS_MAGIC, fstatfs_type

__all__ = ["merged_view"]

#: The child makes two namespaces and one mount: seconds are plenty on a loaded host.
_TIMEOUT = 30.0
_CHILD = Path(__file__).with_name("_mergechild.py")


def merged_view(layers: tuple[int, ...]) -> int:
    """A descriptor (close-on-exec, the caller's) of the read-only overlay of the held
    ``layers`` (top first); ``OSError`` where the kernel or the child refused it."""
    if len(layers) < 2:
        raise OSError(errno.EINVAL, "a stack of layers holds two at least")
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        argv = [sys.executable, "-I", "-S", str(_CHILD), str(there.fileno())]
        argv += [str(fd) for fd in layers]
        child = subprocess.Popen(
            argv,
            pass_fds=(there.fileno(), *layers),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={},
        )
        there.close()
        try:
            here.settimeout(_TIMEOUT)
            message, fds, _, _ = socket.recv_fds(here, 4096, 1)
        except OSError:
            child.kill()
            raise
        finally:
            child.wait()
    finally:
        here.close()
        there.close()
    if message != b"ok" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise _refusal(message)
    return _checked(fds[0])


def _refusal(message: bytes) -> OSError:
    words = message.decode("utf-8", "replace").split(" ", 2)
    if len(words) == 3 and words[0] == "error":
        return OSError(getattr(errno, words[1], errno.EIO), words[2])
    return OSError(errno.EPROTO, f"the stack's overlay was not made: {message[:200]!r}")


def _checked(fd: int) -> int:
    """``fd`` if it is a read-only overlay's folder; else closed, and ``EPROTO``."""
    try:
        os.set_inheritable(fd, False)
        info = os.fstat(fd)
        flags = os.fstatvfs(fd).f_flag
        kind = fstatfs_type(fd)
    except OSError:
        os.close(fd)
        raise
    if not (stat.S_ISDIR(info.st_mode) and flags & os.ST_RDONLY and kind == OVERLAYFS_MAGIC):
        os.close(fd)
        raise OSError(errno.EPROTO, "the stack's merged view is not a read-only overlay")
    return fd
