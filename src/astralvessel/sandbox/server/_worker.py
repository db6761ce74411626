"""The file worker: answers ``fs`` requests as the sandbox's unprivileged user (stdlib, 3.8+).

The server may hold privileges (to make namespaces and mount ``/proc``), so it
never opens a path a model named. It forks this worker once at startup; the
worker drops to the call's uid and gid, sets ``no_new_privs``, stacks its own
seccomp filter over the server's (none of the server's allowances, no socket,
no process: ``_seccomp.FILE_WORKER`` on the host) and then serves
one request at a time over a pair of pipes, in the same frame format as the
host protocol (``_fsops``: read, write, list, and the built-in file tools'
views). So a file tool can never show more than a confined call could read.
"""

from __future__ import annotations

import os
import sys
import time

from . import _launch, _protocol, _sys
from ._lean import signal, suppress

__all__ = ["FileContext", "Worker", "start_worker"]

# Annotations only: typing costs every turn's start milliseconds (mypy takes the branch).
TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc.Callable is not subscriptable at run time on Python 3.8
    from collections.abc import Callable
    from typing import Any

    Handler = Callable[[str, dict[str, Any], Any], tuple[str, bool]]


class FileContext:
    """What a file tool needs to know about the sandbox for one request."""

    def __init__(
        self,
        *,
        workdir: str,
        visible_roots: tuple[str, ...],
        timeout: float,
        path_map: dict[str, str],
        workspace: str,
        outbox: str,
        writable_roots: tuple[str, ...] = (),
        upper: int = -1,
    ) -> None:
        self.workdir = workdir
        self.visible_roots = visible_roots
        self.timeout = timeout
        #: ``time.monotonic()`` value by which the tool should stop and say so.
        self.deadline = time.monotonic() + timeout
        self.path_map = path_map
        self.workspace = workspace
        self.outbox = outbox
        #: Where the host's ``write_file`` may write (the workspace, writable mounts).
        self.writable_roots = writable_roots
        #: The turn's upper layer, opened before the overlay covered it (-1: no overlay):
        #: what a snapshot reads to know which files are still the snapshot's own.
        self.upper = upper


def _load_handler() -> Handler | None:
    try:
        from . import _files
    except ImportError:
        return None
    handle: Handler = _files.handle
    return handle


def _warm_files() -> None:
    """Import what the file tools need while this process can still read the library."""
    try:
        from . import _files
    except ImportError:
        return
    _files.warm()


class Worker:
    """The server's handle on a running worker: its pid and the two pipe ends."""

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self.requests = requests
        self.replies = replies

    def kill(self) -> None:
        """Kill and reap the worker and close its pipes."""
        with suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self.requests, self.replies):
            with suppress(OSError):
                os.close(fd)


def start_worker(
    *,
    drop_uid: int | None,
    drop_gid: int | None,
    context: dict[str, Any],
    own_userns: bool = False,
    confine: bool = True,
    seccomp: bytes | None = None,
    install_seccomp: Callable[[bytes], None] | None = None,
) -> Worker:
    """Fork the worker; the server writes request frames to ``requests`` and reads ``replies``.

    ``own_userns``: take the calls' own kind of user namespace (see ``_userns``), as
    a confining server whose probe found it works does; ``confine`` False (unconfined
    calls) keeps the server's identity (see ``_launch.become_call_user``). ``seccomp``:
    the worker's own filter, which ``install_seccomp`` stacks over the server's before
    the first request (see ``_launch.stack_filter``).
    """
    req_r, req_w = os.pipe()
    try:
        rep_r, rep_w = os.pipe()
    except OSError:
        _close_all(req_r, req_w)
        raise
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        # No worker (EAGAIN at the process bound, ENOMEM): the four ends are the caller's
        # to lose otherwise, and a server that retries would run out of descriptors.
        _close_all(req_r, req_w, rep_r, rep_w)
        raise
    if pid == 0:
        try:
            _launch.close_fds_except({req_r, rep_w, int(context.get("upper", -1))} - {-1})
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _launch.die_with_parent(lambda: os.getppid() != server)
            _warm_files()
            _launch.become_call_user(drop_uid, drop_gid, own_userns=own_userns, confine=confine)
            # Either cleared the parent-death signal (the ids changed): armed again.
            _launch.die_with_parent(lambda: os.getppid() != server)
            _sys.prctl(_sys.PR_SET_NO_NEW_PRIVS, 1)
            _launch.stack_filter(seccomp, install_seccomp)
            _serve(req_r, rep_w, context)
        except BaseException:
            # The interpreter's own hook prints the traceback without importing a module,
            # which this process, now the call's user, may not be able to read.
            sys.excepthook(*sys.exc_info())
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(rep_w)
    os.set_blocking(rep_r, False)
    return Worker(pid, req_w, rep_r)


def _close_all(*fds: int) -> None:
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


def _serve(requests: int, replies: int, context: dict[str, Any]) -> None:
    decoder = _protocol.FrameDecoder()
    while True:
        frame = decoder.next()
        if frame is None:
            data = os.read(requests, 65536)
            if not data:
                return
            decoder.feed(data)
            continue
        header, body = frame
        fields, data = _answer_fs(header, body, context)
        reply = dict(fields, type="fs_result", id=header.get("id"))
        _launch._write_all(replies, _protocol.encode(reply, data))


def _answer_fs(
    header: dict[str, Any], body: bytes, context: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    try:
        from . import _fsops
    except ImportError:
        return {"error": {"errno": "ENOSYS", "message": "file primitives are unavailable"}}, b""
    ctx = FileContext(timeout=float(header.get("timeout", 30.0)), **context)
    try:
        return _fsops.handle(header, body, ctx)
    except Exception as exc:
        message = f"internal error in the file worker: {type(exc).__name__}: {exc}"
        return {"error": {"errno": "EIO", "message": message}}, b""
