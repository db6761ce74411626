"""The zygote: the one process that forks every call's init (stdlib only, Python 3.8+).

Forking a Python process shares all its memory copy-on-write, and every page
either side writes afterwards is copied on the spot. If the server forked each
call itself, it would pay that again for every page it touches while serving the
next call (a few hundred page faults, a millisecond or more on a small VM),
right on the call's path. So the server starts the zygote once, after
``hello``, and the zygote forks each call's init straight into a new PID
namespace (``_init.fork_chain``): the zygote does almost nothing between
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
the child's ends of a call's pipes attached (``SCM_RIGHTS``) forks a chain
(``F<uid><gid>`` one whose call sees those ids: an exec that names a user),
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

import _socket  # socket's C type: the socket module would import enum (see _lean)
import gc
import os
import struct

from . import _init, _launch, _sys, _userns
from ._lean import EVENT_READ, Selector, signal, suppress

__all__ = ["CLOSE_GRACE", "Zygote", "start"]

_FORK = b"F"
_KILL = b"K"
_PID = struct.Struct("!i")
_FD = struct.Struct("i")
_IDS = struct.Struct("!II")
_STATUS = _init.CHAIN_FDS.index("status")
#: Seconds a closed zygote has to carry out its last orders and exit before it is killed.
CLOSE_GRACE = 1.0


class Zygote:
    """The server's handle on its zygote: its pid, the socket orders go through, and
    ``call_depth``, how many PID namespaces deep (``NSpid`` in the server's ``/proc``,
    counted from the server's own) each call's processes are: 2 under a zygote in the
    server's namespace, 3 under a launcher's."""

    def __init__(self, pid: int, sock: _socket.socket, call_depth: int) -> None:
        self.pid = pid
        self.sock = sock
        self.call_depth = call_depth

    def order(self, child_fds: list[int], identity: tuple[int, int] | None = None) -> None:
        """Have the zygote fork one chain on ``child_fds``; raises ``OSError`` if it is gone.

        ``identity``: the uid and gid the call sees inside its user namespace,
        instead of the plan's (see ``LaunchPlan.with_identity``).
        """
        fds = b"".join(_FD.pack(fd) for fd in child_fds)
        rights = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)
        message = _FORK if identity is None else _FORK + _IDS.pack(*identity)
        self.sock.sendmsg([message], [rights])

    def kill(self, pid: int) -> None:
        """Have the zygote SIGKILL the init it named ``P<pid>``, unless it reaped it already."""
        with suppress(OSError):
            self.sock.send(_KILL + _PID.pack(pid))

    def close(self) -> None:
        """End the zygote and reap it: it carries out the orders already sent, then exits.

        The end of the socket reaches the zygote after every order queued before
        it, so the server's last kills (``_stop_everything``) are the zygote's
        own, not left to the inits' parent-death signal; the zygote's end closes
        only when it exits. One that has not within ``CLOSE_GRACE`` is killed.
        """
        with suppress(OSError):
            self.sock.shutdown(_socket.SHUT_WR)
            with Selector() as selector:
                selector.register(self.sock, EVENT_READ)
                selector.select(CLOSE_GRACE)  # readable at its end: the zygote never writes
        with suppress(OSError):
            self.sock.close()
        with suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def start(plan: _launch.LaunchPlan, env: dict[str, str]) -> Zygote:
    """Fork the zygote (or, where it needs one, its launcher) from this (the server's) process.

    Raises ``OSError`` if it cannot. ``Zygote.pid`` is this process's child,
    which exits when the zygote does.
    """
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    server = os.getpid()
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    try:
        # What fork_chain does after every fork, tried here once (it changes nothing): refused
        # (EPERM) where the host's user namespace owns this PID namespace (Docker).
        _sys.setns(own_pid_ns, _sys.CLONE_NEWPID)
        launcher = False
    except OSError:
        launcher = True
    _launch.release_free_memory()  # before the fork: the zygote would keep them too
    try:
        pid = os.fork()
    except OSError:
        os.close(own_pid_ns)
        raise
    if pid == 0:
        try:
            ours.close()
            _launch.close_fds_except({theirs.fileno(), own_pid_ns})
            _launch._child_signals()
            _launch.die_with_parent(lambda: os.getppid() != server)
            if launcher:
                os.close(own_pid_ns)
                _launch_zygote(theirs, plan, env)
            else:
                _Loop(theirs, plan, env, own_pid_ns).serve()
        finally:
            os._exit(0)
    theirs.close()
    os.close(own_pid_ns)
    return Zygote(pid, ours, _depth() + (2 if launcher else 1))


def _depth() -> int:
    """How many PID namespaces deep this process is, as its ``/proc`` counts (``NSpid``)."""
    with open("/proc/self/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"NSpid:"):
                return len(line.split()) - 1
    return 1  # a kernel older than 4.1 has no NSpid (and no per-call memory watch either)


def _launch_zygote(sock: _socket.socket, plan: _launch.LaunchPlan, env: dict[str, str]) -> None:
    """Fork the zygote as pid 1 of a new PID namespace, then wait for it to exit."""
    alive_r, alive_w = os.pipe()
    _sys.unshare(_sys.CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(alive_w)
            # getppid() is 0 across a PID namespace; a closed pipe says the launcher died.
            _launch.die_with_parent(lambda: _launch.pipe_closed(alive_r))
            os.close(alive_r)
            _Loop(sock, plan, env, os.open("/proc/self/ns/pid", os.O_RDONLY)).serve()
        finally:
            os._exit(0)
    sock.close()  # the zygote's end only: when it dies, the server's sends fail at once
    os.close(alive_r)
    _init._idle_priority()
    os.waitpid(pid, 0)


class _Loop:
    """The zygote's state: the order socket, and the status pipe of each init not yet reaped."""

    def __init__(
        self, sock: _socket.socket, plan: _launch.LaunchPlan, env: dict[str, str], own_pid_ns: int
    ) -> None:
        self.sock = sock
        self.plan = plan
        self.env = env
        self.status: dict[int, int] = {}
        # Each init checks the read end for its parent's death; only the zygote writes.
        self.alive_r, self.alive_w = os.pipe()
        #: The zygote's own PID namespace (open), which it returns to after each fork.
        self.own_pid_ns = own_pid_ns
        #: Each init asks on ``maps[1]`` (which it inherits, and closes before its request)
        #: for its user namespace's ids, and the zygote writes them (``_map``).
        self.maps = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)

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
        with Selector() as selector:
            selector.register(self.sock, EVENT_READ)
            selector.register(wake_r, EVENT_READ)
            selector.register(self.maps[0], EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fd == wake_r:
                        with suppress(OSError):
                            while os.read(wake_r, 4096):
                                pass
                    elif key.fd == self.maps[0].fileno():
                        self._map()
                    elif not self._take_order():
                        return
                self._reap()

    def _take_order(self) -> bool:
        """Carry out one order; False once the server has closed the socket."""
        try:
            # Close-on-exec from the start: a received descriptor is inheritable otherwise,
            # and the call's status pipe must never reach the call.
            message, ancillary, _, _ = self.sock.recvmsg(
                16, _socket.CMSG_SPACE(len(_init.CHAIN_FDS) * _FD.size), _socket.MSG_CMSG_CLOEXEC
            )
        except InterruptedError:
            return True
        if not message:
            return False
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [fd for (fd,) in _FD.iter_unpack(data[: len(data) - len(data) % _FD.size])]
        if message[:1] == _KILL and len(message) == 1 + _PID.size and not fds:
            (pid,) = _PID.unpack(message[1:])
            if pid in self.status:  # not reaped yet, so the pid still names that init
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return True
        plan = self._plan_for(message)
        if plan is None or len(fds) != len(_init.CHAIN_FDS):
            for fd in fds:
                with suppress(OSError):
                    os.close(fd)
            return True
        status = fds[_STATUS]
        try:
            pid = _init.fork_chain(
                plan,
                self.env,
                fds,
                alive=self.alive_r,
                own_pid_ns=self.own_pid_ns,
                mapper=self.maps[1].fileno(),
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

    def _map(self) -> None:
        """Write the ids of one init's new user namespace, as it asked; answer on its pipe.

        The zygote holds the capabilities in the parent namespace that the maps
        need, as the init did before it entered its own. The host ids are the
        plan's (the turn's), whatever the init asks: it names only the ids
        inside, which change what a call sees, never what it can reach.
        """
        try:
            message, ancillary, _, _ = self.maps[0].recvmsg(
                16, _socket.CMSG_SPACE(_userns.MAP_FDS.size), _socket.MSG_CMSG_CLOEXEC
            )
        except InterruptedError:
            return
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [fd for (fd,) in _FD.iter_unpack(data[: len(data) - len(data) % _FD.size])]
        try:
            if len(fds) != 2 or message[:1] != _userns.MAP_REQUEST:
                return
            proc, answer = fds
            inner, inner_gid = _userns.MAP_IDS.unpack(message[1:])
            plan = self.plan
            uid = os.geteuid() if plan.drop_uid is None else plan.drop_uid
            gid = os.getegid() if plan.drop_gid is None else plan.drop_gid
            try:
                _userns.map_ids(proc, uid, gid, inner, inner_gid)
            except (OSError, ValueError) as exc:
                reply = f"E{exc}".encode(errors="replace")
            else:
                reply = b"x"
            with suppress(OSError):
                os.write(answer, reply)
        except (ValueError, struct.error, OSError):
            pass  # a malformed request: its pipe closes unanswered, and that init gives up
        finally:
            for fd in fds:
                with suppress(OSError):
                    os.close(fd)

    def _plan_for(self, message: bytes) -> _launch.LaunchPlan | None:
        """The plan a fork order asks for (``F``, or ``F<uid><gid>``); None for any other."""
        if message == _FORK:
            return self.plan
        if message[:1] == _FORK and len(message) == 1 + _IDS.size:
            return self.plan.with_identity(*_IDS.unpack(message[1:]))
        return None

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
    with suppress(OSError, AttributeError):
        os.posix_spawn("/nonexistent/astralvessel-warm-up", ["warm-up"], {}, setsigmask=())
