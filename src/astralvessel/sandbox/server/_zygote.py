"""The zygote: the one process that forks every call's namespaces (stdlib only, Python 3.8+).

Forking a Python process shares all its memory copy-on-write, and every page
either side writes afterwards is copied on the spot. If the server forked each
call itself, it would pay that again for every page it touches while serving the
next call (a few hundred page faults, a millisecond or more on a small VM),
right on the call's path. So the server forks the zygote once, after ``hello``,
and the zygote forks each call's intermediate (``_launch.fork_chain``): the
zygote does almost nothing between forks, so it touches few pages, and the
server, which never forks a call again, touches its own.

The server sends an order as one byte with the child's ends of the call's pipes
attached (``SCM_RIGHTS``) over a socket pair. There is no reply: the chain
reports on its status pipe. The kernel reaps the intermediates the zygote forked
(it ignores SIGCHLD), and the zygote exits when the server closes the socket or
dies (``PR_SET_PDEATHSIG``); the chains it forked die with it in turn.
"""

from __future__ import annotations

import array
import contextlib
import gc
import os
import signal
import socket

from . import _launch

__all__ = ["Zygote", "start"]

_ORDER = b"F"
_FD_BYTES = array.array("i").itemsize


class Zygote:
    """The server's handle on its zygote: its pid and the socket orders go through."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    def order(self, child_fds: list[int]) -> None:
        """Have the zygote fork one chain on ``child_fds``; raises ``OSError`` if it is gone."""
        rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", child_fds).tobytes())
        self.sock.sendmsg([_ORDER], [rights])

    def close(self) -> None:
        """Close the socket (the zygote then exits) and reap the zygote, killing it if need be."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def start(plan: _launch.LaunchPlan, env: dict[str, str]) -> Zygote:
    """Fork the zygote from this (the server's) process; raises ``OSError`` if it cannot."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _launch.close_fds_except({theirs.fileno()})
            _launch._child_signals()
            _launch.prctl(_launch.PR_SET_PDEATHSIG, 9)
            if os.getppid() == server:
                _serve(theirs, plan, env)
        finally:
            os._exit(0)
    theirs.close()
    return Zygote(pid, ours)


def _warm_spawn() -> None:
    """Take ``posix_spawn`` through its first use here, once, rather than in every call.

    The first call in a process binds libc's symbols and sets up Python's side of
    it; done here, every init forked later inherits that done, which takes about
    a third off its first (and only) ``posix_spawn``. The path does not exist, so
    the child fails at the exec and nothing runs.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.posix_spawn("/nonexistent/astralvessel-warm-up", ["warm-up"], {}, setsigmask=())


def _serve(sock: socket.socket, plan: _launch.LaunchPlan, env: dict[str, str]) -> None:
    # Nothing here makes reference cycles; a collection would touch (and copy) every object.
    gc.disable()
    # The kernel reaps the intermediates as they exit (each resets SIGCHLD for its own init).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _warm_spawn()
    room = socket.CMSG_SPACE(len(_launch.CHAIN_FDS) * _FD_BYTES)
    while True:
        message, ancillary, _, _ = sock.recvmsg(1, room)
        if not message:
            return
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % _FD_BYTES])
        try:
            if len(fds) == len(_launch.CHAIN_FDS):
                _launch.fork_chain(plan, env, list(fds))
            elif len(fds) > 2:
                _launch._report(fds[2], "E the zygote got an order it cannot read")
        except OSError as exc:
            if len(fds) > 2:
                _launch._report(fds[2], f"E cannot fork the call: {exc}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
