"""The zygote: the one process that forks every call's init (stdlib only, Python 3.8+).

Forking a Python process shares all its memory copy-on-write, and every page
either side writes afterwards is copied on the spot. If the server forked each
call itself, it would pay that again for every page it touches while serving the
next call (a few hundred page faults, a millisecond or more on a small VM),
right on the call's path. So the server starts the zygote once, after
``hello``, and the zygote forks each call's init straight into a new PID
namespace (``_launch.fork_chain``): the zygote does almost nothing between
forks, so it touches few pages, and the server, which never forks a call
again, touches its own.

The zygote is a plain child of the server where it may come back to the
server's PID namespace with ``setns`` after each ``unshare(CLONE_NEWPID)``:
under bubblewrap and nsjail the sandbox's user namespace (or, as root, the
host's) owns that namespace, and the zygote holds its capabilities there.
Docker's PID namespace belongs to the host, which refuses that ``setns``; there
the zygote's child *launcher* makes a PID namespace of the sandbox's user
namespace, forks the zygote as its pid 1 and only waits. An idle turn then
holds one Python process more, so the launcher exists only where it must. Each
init has ``PR_SET_PDEATHSIG`` on the zygote: when the zygote dies, every init
dies, and every call with it.

Orders come over a ``SOCK_SEQPACKET`` socket pair, one per packet: ``F`` with
the child's ends of a call's pipes attached (``SCM_RIGHTS``) forks a chain,
``K<pid>`` kills one. There is no reply: the zygote writes ``P<pid>`` on the
chain's status pipe once init is forked, and init reports the rest. The zygote
reaps every init and then writes ``D`` on its status pipe: init says ``D``
itself when its call ends, but an init killed on a timeout cannot, and the
kernel lets the zygote reap pid 1 only once every other process of its
namespace is gone. Only the zygote can reap an init, so a pid it is asked to
kill cannot have been reused. The zygote exits when the server closes the
socket or dies (``PR_SET_PDEATHSIG`` on the zygote, and on its launcher).
"""

from __future__ import annotations

import array
import contextlib
import gc
import os
import selectors
import signal
import socket
import struct

from . import _launch

__all__ = ["Zygote", "start"]

_FORK = b"F"
_KILL = b"K"
_PID = struct.Struct("!i")
_FD_BYTES = array.array("i").itemsize
_STATUS = _launch.CHAIN_FDS.index("status")


class Zygote:
    """The server's handle on its zygote: its pid and the socket orders go through."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    def order(self, child_fds: list[int]) -> None:
        """Have the zygote fork one chain on ``child_fds``; raises ``OSError`` if it is gone."""
        rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", child_fds).tobytes())
        self.sock.sendmsg([_FORK], [rights])

    def kill(self, pid: int) -> None:
        """Have the zygote SIGKILL the init it named ``P<pid>``, unless it reaped it already."""
        with contextlib.suppress(OSError):
            self.sock.send(_KILL + _PID.pack(pid))

    def close(self) -> None:
        """Close the socket (the zygote then exits) and reap the zygote, killing it if need be."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def start(plan: _launch.LaunchPlan, env: dict[str, str]) -> Zygote:
    """Fork the zygote (or, where it needs one, its launcher) from this (the server's) process.

    Raises ``OSError`` if it cannot. ``Zygote.pid`` is this process's child,
    which exits when the zygote does.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = os.getpid()
    _launch.release_free_memory()  # before the fork: the zygote would keep them too
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _launch.close_fds_except({theirs.fileno()})
            _launch._child_signals()
            _launch.prctl(_launch.PR_SET_PDEATHSIG, 9)
            if os.getppid() == server:
                _become_zygote(theirs, plan, env)
        finally:
            os._exit(0)
    theirs.close()
    return Zygote(pid, ours)


def _become_zygote(sock: socket.socket, plan: _launch.LaunchPlan, env: dict[str, str]) -> None:
    """Serve as the zygote right here if this PID namespace takes it back after each
    ``unshare``; otherwise launch one as pid 1 of a namespace of its own."""
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    try:
        # What fork_chain does after every fork, tried once before the first: refused
        # (EPERM) where the host's user namespace owns this PID namespace (Docker).
        _launch.setns(own_pid_ns, _launch.CLONE_NEWPID)
    except OSError:
        os.close(own_pid_ns)
        _launch_zygote(sock, plan, env)
        return
    _Loop(sock, plan, env, own_pid_ns).serve()


def _launch_zygote(sock: socket.socket, plan: _launch.LaunchPlan, env: dict[str, str]) -> None:
    """Fork the zygote as pid 1 of a new PID namespace, then wait for it to exit."""
    alive_r, alive_w = os.pipe()
    _launch.unshare(_launch.CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(alive_w)
            _launch.prctl(_launch.PR_SET_PDEATHSIG, 9)
            # getppid() is 0 across a PID namespace; a closed pipe says the launcher died.
            os.set_blocking(alive_r, False)
            with contextlib.suppress(BlockingIOError):
                if os.read(alive_r, 1) == b"":
                    return
            os.close(alive_r)
            _Loop(sock, plan, env, os.open("/proc/self/ns/pid", os.O_RDONLY)).serve()
        finally:
            os._exit(0)
    sock.close()  # the zygote's end only: when it dies, the server's sends fail at once
    os.close(alive_r)
    _launch._idle_priority()
    os.waitpid(pid, 0)


class _Loop:
    """The zygote's state: the order socket, and the status pipe of each init not yet reaped."""

    def __init__(
        self, sock: socket.socket, plan: _launch.LaunchPlan, env: dict[str, str], own_pid_ns: int
    ) -> None:
        self.sock = sock
        self.plan = plan
        self.env = env
        self.status: dict[int, int] = {}
        # Each init checks the read end for its parent's death; only the zygote writes.
        self.alive_r, self.alive_w = os.pipe()
        #: The zygote's own PID namespace (open), which it returns to after each fork.
        self.own_pid_ns = own_pid_ns

    def serve(self) -> None:
        """Fork on every order and reap every init, until the server closes the socket."""
        # Nothing here makes reference cycles; a collection would touch (and copy) every object.
        gc.disable()
        _launch.reset_ignored_signals()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a status pipe the server closed
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wake_w)
        _warm_spawn()
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            selector.register(wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fd == wake_r:
                        with contextlib.suppress(OSError):
                            while os.read(wake_r, 4096):
                                pass
                    elif not self._take_order():
                        return
                self._reap()

    def _take_order(self) -> bool:
        """Carry out one order; False once the server has closed the socket."""
        try:
            # Close-on-exec from the start: a received descriptor is inheritable otherwise,
            # and the call's status pipe must never reach the call.
            message, ancillary, _, _ = self.sock.recvmsg(
                16, socket.CMSG_SPACE(len(_launch.CHAIN_FDS) * _FD_BYTES), socket.MSG_CMSG_CLOEXEC
            )
        except InterruptedError:
            return True
        if not message:
            return False
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % _FD_BYTES])
        if message[:1] == _KILL and len(message) == 1 + _PID.size and not fds:
            (pid,) = _PID.unpack(message[1:])
            if pid in self.status:  # not reaped yet, so the pid still names that init
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return True
        if message != _FORK or len(fds) != len(_launch.CHAIN_FDS):
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return True
        status = fds[_STATUS]
        try:
            pid = _launch.fork_chain(
                self.plan, self.env, list(fds), alive=self.alive_r, own_pid_ns=self.own_pid_ns
            )
        except OSError as exc:
            _launch._report(status, f"E cannot fork the call: {exc}")
            # Out of its own PID namespace for children, this zygote can fork no more
            # chains: exit, and the server starts a new one.
            raise SystemExit(1) from None
        finally:
            for index, fd in enumerate(fds):
                if index != _STATUS:
                    os.close(fd)
        _launch._report(status, f"P{pid}")
        self.status[pid] = status
        return True

    def _reap(self) -> None:
        """Reap every init that has exited and say ``D`` for it: its namespace is empty."""
        while self.status:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status = self.status.pop(pid, None)
            if status is not None:
                _launch._report(status, "D")
                os.close(status)


def _warm_spawn() -> None:
    """Take ``posix_spawn`` through its first use here, once, rather than in every call.

    The first call in a process binds libc's symbols and sets up Python's side of
    it; done here, every init forked later inherits that done, which takes about
    a third off its first (and only) ``posix_spawn``. The path does not exist, so
    the child fails at the exec and nothing runs.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.posix_spawn("/nonexistent/astralvessel-warm-up", ["warm-up"], {}, setsigmask=())
