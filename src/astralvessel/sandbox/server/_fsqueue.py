"""The sandbox server's side of the file worker: ``fs`` requests, one at a time (stdlib, 3.8+).

The worker (``_worker``) answers file primitives as the calls' user, one request
at a time. This queue checks each request, maps its paths, hands it over when
the worker is free, relays the answer, and replaces a worker that died, broke
protocol or ran past a request's timeout, answering that request with why. The
worker starts with the first request: an idle turn then holds one Python process
fewer, and its start forks one fewer. A worker left idle for ``idle_limit`` seconds
is retired for the same reason: it holds the file tools' imports (several MiB of
private pages), and a turn waiting on its model would keep them for nothing; the
next request starts a fresh one.
"""

from __future__ import annotations

import os
import time

from . import _launch, _protocol, _worker
from ._calls import map_path
from ._lean import EVENT_READ, suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._lean import Selector
    from ._messages import FileOp

__all__ = ["FsQueue"]

_READ_SIZE = 65536
# A file request may run this long past its timeout before the worker is replaced.
_WORKER_GRACE = 5.0
#: How long a worker may sit idle before it is retired, unless the hello says otherwise.
WORKER_IDLE = 30.0


class FsQueue:
    """The file requests of one turn, and the worker that answers them."""

    def __init__(
        self,
        send: Callable[[dict[str, Any], bytes], None],
        selector: Selector,
        running: Callable[[], bool],
    ) -> None:
        self.send = send
        self.selector = selector
        #: Whether the server still serves: no worker starts once it is stopping.
        self.running = running
        #: ``_worker.start_worker``'s keywords, set by the hello.
        self.options: dict[str, Any] = {}
        self.path_map: dict[str, str] = {}
        self.worker: _worker.Worker | None = None
        self.decoder = _protocol.FrameDecoder()
        self.queue: list[tuple[dict[str, Any], bytes]] = []
        self.busy: tuple[int, float, float] | None = None  # id, deadline, timeout
        #: Seconds an idle worker lives on (set by the hello).
        self.idle_limit = WORKER_IDLE
        #: When the worker last became free (``time.monotonic``).
        self.idle_since = 0.0

    def deadline(self) -> float | None:
        """When the server must next look at the worker (``time.monotonic``), if ever:
        the held request's time runs out, or an idle worker is due to retire."""
        if self.busy is not None:
            return self.busy[1]
        if self.worker is not None and not self.queue:
            return self.idle_since + self.idle_limit
        return None

    def submit(self, call_id: int, message: FileOp, body: bytes) -> None:
        """Queue a file primitive (read, write, list, a built-in tool's view, a snapshot's
        pack or unpack), each sandbox path mapped to where this side sees it."""
        path = message.path
        arguments = message.arguments or {}
        if self.path_map and path.startswith("/"):
            path = map_path(path, self.path_map)
        view_path = arguments.get("path")
        if self.path_map and isinstance(view_path, str) and view_path.startswith("/"):
            arguments = dict(arguments, path=map_path(view_path, self.path_map))
        # A snapshot's or a restore's op is its message's own: the host's file primitives
        # cannot name it.
        request = dict(
            message.fields(),
            type=message.TYPE,
            id=call_id,
            op=message.WORKER_OP or message.op,
            path=path,
            arguments=arguments,
            timeout=float(message.timeout),
        )
        self.queue.append((request, body))
        self.feed()

    def submit_local(self, call_id: int, answer: Callable[[], dict[str, Any]]) -> None:
        """Queue a request the server answers itself (a freeze): in order with the file
        requests, once the worker holds none, so nothing it does runs across one."""
        self.queue.append(({"id": call_id, "local": answer}, b""))
        self.feed()

    def feed(self) -> None:
        """Hand the next request to the worker if it is free (starting it on first need);
        answer a request of the server's own (``submit_local``) on the spot."""
        while self.busy is None and self.queue and self.running():
            local = self.queue[0][0].get("local")
            if local is not None:
                request_id = self.queue.pop(0)[0]["id"]
                self.send(dict(local(), type="fs_result", id=request_id), b"")
                continue
            self._hand_over()
            return

    def _hand_over(self) -> None:
        worker = self.worker
        if worker is None:
            try:
                worker = self._start()
            except OSError as exc:  # no fork now (the process limit): these requests fail
                while self.queue and self.queue[0][0].get("local") is None:
                    failed, _ = self.queue.pop(0)
                    message = f"file tool cannot start its worker: {exc}"
                    self._fail(failed["id"], "EAGAIN", message)
                self.feed()
                return
        request, body = self.queue.pop(0)
        timeout = request["timeout"]
        self.busy = (request["id"], time.monotonic() + timeout + _WORKER_GRACE, timeout)
        try:
            _launch._write_all(worker.requests, _protocol.encode(request, body))
        except OSError:
            self.replace("the file worker died")

    def retire(self) -> None:
        """Retire an idle worker now (its view is out of date); the next request starts one."""
        if self.busy is None:
            self._retire()

    def check(self, now: float) -> None:
        """Replace the worker if its request ran out of time; retire it if idle too long."""
        busy = self.busy
        if busy is not None and now >= busy[1]:
            self.replace(f"timed out after {busy[2]:g} s")
        elif busy is None and not self.queue and now >= self.idle_since + self.idle_limit:
            self._retire()

    def reap(self) -> None:
        """After SIGCHLD: replace the worker if it died."""
        if self.worker is not None and _launch.has_exited(self.worker.pid):
            self.replace("the file worker died")

    def replace(self, why: str) -> None:
        """Kill the worker, answer its current request with ``why``, start a fresh one."""
        self._retire()
        busy = self.busy
        self.busy = None
        if busy is not None:
            self._fail(busy[0], "ETIMEDOUT", f"file tool {why}")
        # The next request, if one waits, starts a fresh worker.
        self.feed()

    def _retire(self) -> None:
        """Kill and reap the worker, if there is one; the next request starts another."""
        worker = self.worker
        if worker is not None:
            with suppress(KeyError, ValueError):
                self.selector.unregister(worker.replies)
            worker.kill()
            self.worker = None

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()

    def _start(self) -> _worker.Worker:
        self.worker = worker = _worker.start_worker(**self.options)
        self.decoder = _protocol.FrameDecoder()
        self.selector.register(worker.replies, EVENT_READ, self._on_replies)
        return worker

    def _on_replies(self, fd: int, events: int) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            self.replace("the file worker died")
            return
        self.decoder.feed(data)
        while True:
            try:
                frame = self.decoder.next()
            except _protocol.ProtocolError as exc:
                self.replace(f"the file worker broke protocol: {exc}")
                return
            if frame is None:
                return
            header, body = frame
            self.busy = None
            self.idle_since = time.monotonic()
            self.send(header, body)
            self.feed()

    def _fail(self, request_id: int, errno: str, message: str) -> None:
        error = {"errno": errno, "message": message}
        self.send({"type": "fs_result", "id": request_id, "error": error}, b"")
