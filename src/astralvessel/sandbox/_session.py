"""The host side of the sandbox server: a session that speaks to it.

``ServerSession`` boots the server on a backend's channel (the code of
``_server_code``, then the hello of ``_server_hello``), waits for ``ready`` and
multiplexes requests over the pipe; one reader thread hands each frame to the
request waiting for it. What each request sends is ``_requests``', what its
answer reads as ``_replies``', what it keeps meanwhile ``_pending``'s; every
message is defined once, in ``server/_messages``. See ``docs/sandbox-server.md``.

What stays here is one state machine (requests in flight, the reader thread,
the outbox files arriving, close) over one pipe.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import attrs

from .._ground._aio import cancelled_exception, wait_future
from ..errors import SandboxError
from ._api import (
    Channel,
    DetachedProcess,
    DetachRequest,
    ExecRequest,
    ExecResult,
    FsReply,
    FsRequest,
    OutboxFile,
    RunOutcome,
    RunRequest,
    SandboxSession,
)
from ._cgroup import turn_memory_bytes
from ._owner import Owner
from ._pending import Pending, outbox_of
from ._policy import Policy, Promise
from ._replies import ANSWERS, detached_result, exec_result, run_outcome
from ._requests import MESSAGES, AdoptRequest

# The names other modules and tests import from here, from before the split.
from ._server_code import (  # noqa: F401
    BOOTSTRAP,
    SERVER_MODULES,
    ServerBuild,
    _compiled,
    _sources,
    compile_command,
    parse_build,
    server_payload,
)
from ._server_hello import (
    check_ready,
    hello_message,
    known_probe,
    read_ready,
    remember_probe,
    unenforced_promises,
)
from ._server_options import ServerOptions
from ._temporary_outbox import TurnOutbox
from .server import _protocol
from .server._messages import Cancel, Hello, Shutdown

__all__ = [
    "ServerBuild",
    "ServerSession",
    "compile_command",
    "parse_build",
    "server_command",
    "server_payload",
]

#: Its name here from before the split (tests build one).
_Pending = Pending
_Request = RunRequest | ExecRequest | DetachRequest | FsRequest | AdoptRequest

#: The server's confinement probe results, by what they depend on (``_server_hello``): the
#: probe forks a chain of namespaces (about 10 ms of a 60 ms turn start), and its answer
#: is the same for every turn started the same way on this host.
_PROBED: dict[str, dict[str, str]] = {}

#: Seconds the sandbox's file worker may sit idle before the server retires it: it holds
#: the file tools' imports (about 4 MiB of a turn's memory), which a turn waiting on its
#: model keeps for nothing. The next file request starts a fresh one (a few ms).
FILE_WORKER_IDLE = 30.0

# How long past a call's own timeout the host waits before declaring the server stuck
# (covers killing the call and sending its outbox files).
_ANSWER_GRACE = 60.0

#: The most outbox files (and bytes) one turn writes to the host; the server bounds each
#: call (100 files, the disk limit), the host bounds the turn, whatever the server says.
OUTBOX_FILES_PER_TURN = 1000
OUTBOX_BYTES_PER_TURN = 1 << 30
#: Why the host did not keep an outbox file the server sent (``RunOutcome.skipped``'s
#: reasons beside the server's): past the turn's files or bytes, or the host's disk.
PAST_TURN_FILES = "turn_files"
PAST_TURN_BYTES = "turn_bytes"
NOT_WRITTEN = "not_written"
#: The most outbox files one ``exit`` frame may announce (the server's own bound).
_OUTBOX_FILES_PER_CALL = 100


def server_command(
    python: str, build: ServerBuild | None = None, *, first_filter: bytes | None = None
) -> list[str]:
    """Return the argv that starts the server on ``python`` (a path inside the sandbox);
    its length argument is of the payload ``ServerSession.start`` writes, so it lives here.

    ``build``: the modules compiled by that Python, when it is not this one (the
    same must then reach ``ServerOptions.build``). ``first_filter``: a seccomp
    program the server installs, with ``no_new_privs``, before it reads its code.
    """
    argv = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, str(len(server_payload(build)))]
    return argv if first_filter is None else [*argv, first_filter.hex()]


class ServerSession(SandboxSession):
    """A turn's sandbox reached through its server; every backend's session is one of these."""

    def __init__(
        self, channel: Channel, policy: Policy, *, backend: str, outbox_dir: Path | None
    ) -> None:
        self.policy = policy
        self.backend = backend
        self.ready_info: Mapping[str, Any] = {}
        #: The most output bytes the host held for any one call (the bound is ``output_chars * 4``).
        self.max_buffered_output = 0
        #: Where the host laid the workspace's overlay (``ServerLink.upper_names``): the
        #: names its upper layer holds, given with each snapshot listing.
        self.upper_names: Callable[[], frozenset[bytes] | None] | None = None
        #: Raises the turn's memory bound by that many bytes (``ServerLink.widen_memory``).
        self.widen_memory: Callable[[int], None] | None = None
        #: Reads a frozen layer the host cannot read itself (``ServerLink.read_layer``).
        self.read_layer: Callable[[int], AbstractContextManager[Any]] | None = None
        #: Merges a stack of frozen layers the host cannot read (``ServerLink.merge_layers``).
        self.merge_layers: Callable[[tuple[int, ...], bool], int] | None = None
        #: The host's end of the socket a fork's frozen layer goes on (``adopt``); None
        #: where the sandbox was not started adoptable, or once it was offered one.
        self.adopt_socket: socket.socket | None = None
        #: Makes a fork's frozen layer this sandbox's own before it is passed (Docker's:
        #: an idmapped clone for the turn's uid, ``ServerLink.fit_layer``); None: as it is.
        self.fit_layer: Callable[[int], int] | None = None
        #: Lays a fork's files on the workspace from the host and returns that overlay
        #: (``ServerLink.lay_adoption``: root's Docker host); None: ``adopt`` passes layers.
        self.lay_adoption: Callable[..., Any] | None = None
        #: The overlay ``adopt_laid`` had the host lay: closed with the session.
        self._laid_overlay: Any = None
        self._channel = channel
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, Pending] = {}
        self._next_id = 1
        self._dead: str | None = None
        self._closed = False
        #: The process that started the sandbox: a forked child never uses or ends it.
        self._owner = Owner()
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        # Without a host folder (here or on the policy), outbox files go to a temporary folder
        # that outlives ``close`` while a result names a file in it.
        self._turn_outbox = TurnOutbox(
            outbox_dir if outbox_dir is not None else policy.outbox_dir, f"{self.backend}-outbox"
        )
        self._outbox_files = 0
        self._outbox_bytes = 0
        self._reader = threading.Thread(
            target=self._read_loop, name=f"{backend}-server-reader", daemon=True
        )

    @classmethod
    def start(
        cls,
        channel: Channel,
        policy: Policy,
        *,
        backend: str,
        options: ServerOptions | None = None,
        outbox_dir: Path | None = None,
        **fields: Any,
    ) -> ServerSession:
        """Boot the server on ``channel`` (payload, then ``hello``) as ``options`` say, and
        wait for ``ready``. ``options`` may come as its fields instead (``confine=``...).

        Raises ``SandboxError`` if the server does not come up (with its stderr
        tail), and ``PromiseNotEnforcedError`` if it cannot confine calls as
        asked and ``policy.relaxed`` does not allow that. Closes the channel on
        any failure. ``outbox_dir`` keeps outbox files after ``close``; without
        it they go to a temporary folder removed at ``close``, or later, when the
        last ``OutboxFile`` naming a file in it is collected.
        """
        if options is None:
            options = ServerOptions(**fields)
        elif fields:
            raise TypeError("ServerSession.start takes options or their fields, not both")
        session = cls(channel, policy, backend=backend, outbox_dir=outbox_dir)
        session.peer_uid = options.peer_uid
        hello = hello_message(policy, options, file_worker_idle=FILE_WORKER_IDLE)
        key, hello = known_probe(_PROBED, options.probe_key, hello)
        timeout = options.ready_timeout
        try:
            session._reader.start()
            hello_frame = _protocol.encode(hello.to_json())
            passed = _passed_with_hello(policy, options)
            if not passed:
                session._send(server_payload(options.build) + hello_frame)
            else:
                # The layer (or the adoption socket) goes with the hello's first byte, which
                # the server's loop reads (its bootstrap reads the payload's bytes exactly,
                # none past them).
                session._send(server_payload(options.build))
                session._send_fds(hello_frame, passed)
            try:
                header = session._ready.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                raise SandboxError(
                    f"the {backend} sandbox server did not become ready within {timeout:g} s; "
                    f"{channel.describe_exit()}"
                ) from None
            session._boot(header, hello, key)
        except BaseException:
            session.close()
            raise
        return session

    def _boot(self, header: dict[str, Any], hello: Hello, key: str | None) -> None:
        """Take the server's ``ready``: remember its probe, refuse what it cannot give."""
        ready = read_ready(self.backend, header)
        remember_probe(_PROBED, key, hello, ready)
        self.ready_info = header
        check_ready(self.backend, self.policy, hello, ready)

    @property
    def channel(self) -> Channel:
        """The channel the backend opened to this turn's server (what it ran on, for tests)."""
        return self._channel

    def unenforced(self) -> Mapping[Promise, str]:
        """The promises the server reported it cannot keep here, each with why."""
        return unenforced_promises(dict(self.ready_info.get("problems") or {}))

    def alive(self) -> bool:
        """False once the session is closed or its server has gone (the reader saw it end),
        and in a forked child (``_owner``)."""
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            return False
        with self._lock:
            return not self._closed and self._dead is None

    # -- wire --------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self._channel.send(data)
            except OSError as exc:
                raise SandboxError(
                    self._death(f"cannot write to the sandbox server ({exc})")
                ) from None

    def _send_fds(self, data: bytes, fds: tuple[int, ...]) -> None:
        send_fds = getattr(self._channel, "send_fds", None)
        if send_fds is None:
            raise SandboxError("the sandbox's channel cannot pass descriptors")
        with self._send_lock:
            try:
                send_fds(data, fds)
            except OSError as exc:
                raise SandboxError(
                    self._death(f"cannot write to the sandbox server ({exc})")
                ) from None

    def _death(self, what: str) -> str:
        return f"{what}; {self._channel.describe_exit()}"

    def _read_loop(self) -> None:
        decoder = _protocol.FrameDecoder()
        reason = "the sandbox server closed its output"
        try:
            while True:
                data = self._channel.recv(65536)
                if not data:
                    if decoder.buffered:
                        # A frame cut short: whatever it was, the call it served has no end.
                        reason = (
                            "the sandbox server's output ended inside a frame "
                            f"({decoder.buffered} bytes of it came)"
                        )
                    break
                decoder.feed(data)
                while (frame := decoder.next()) is not None:
                    self._on_frame(*frame)
        except _protocol.ProtocolError as exc:
            reason = f"the sandbox server broke protocol ({exc})"
            self._channel.close()
        except OSError as exc:
            reason = f"cannot read from the sandbox server ({exc})"
        except Exception as exc:
            reason = f"the sandbox session failed ({type(exc).__name__}: {exc})"
            self._channel.close()
        self._fail_all(reason if self._closed else self._death(reason))

    def _fail_all(self, message: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = message
            pending = list(self._pending.values())
            self._pending.clear()
        error = SandboxError(self._dead)
        if not self._ready.done():
            self._ready.set_exception(error)
        for item in pending:
            self._settle(item, exception=error)

    @staticmethod
    def _settle(
        item: Pending, *, result: object = None, exception: BaseException | None = None
    ) -> None:
        if item.current is not None:
            item.current.close()
            item.current = None
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                item.future.set_exception(exception)
            else:
                item.future.set_result(result)
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                item.started.set_exception(exception)
            else:
                item.started.set_result(None)

    def _on_frame(self, header: dict[str, Any], body: bytes) -> None:
        kind = header["type"]
        if kind == "ready":
            if not self._ready.done():
                self._ready.set_result(header)
            return
        raw_id = header.get("id")
        if kind == "error" and raw_id is None:
            raise _protocol.ProtocolError(f"the server gave up: {header.get('message')}")
        call_id = raw_id if isinstance(raw_id, int) else -1
        with self._lock:
            item = self._pending.get(call_id)
        if item is None:
            return  # a call the host stopped waiting for (cancelled): drop what is left of it
        answer = ANSWERS.get(kind)
        if answer is not None:
            outcome = answer(header, body)
            if isinstance(outcome, BaseException):
                self._finish(call_id, exception=outcome)
            else:
                self._finish(call_id, outcome)
            return
        self._on_stream(call_id, item, kind, header, body)

    def _on_stream(
        self, call_id: int, item: Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> None:
        """A frame of a running request, read by its kind's reader (``_STREAM_READERS``)."""
        if not _STREAM_READERS[item.kind](self, call_id, item, kind, header, body):
            raise _protocol.ProtocolError(f"unexpected frame type {kind!r}")

    def _read_run(
        self, call_id: int, item: Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> bool:
        """A tool call's output, its exit, or an outbox file's bytes."""
        if kind == "out":
            item.add_output(body)
            self.max_buffered_output = max(self.max_buffered_output, len(item.output))
        elif kind == "exit":
            self._on_exit(call_id, item, header)
        elif kind == "file":
            self._on_file_chunk(call_id, item, body)
        else:
            return False
        return True

    def _read_exec(
        self, call_id: int, item: Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> bool:
        """An exec's output on one of its streams, or its exit."""
        if kind == "out":
            item.add_stream("stderr" if header.get("stream") == "stderr" else "stdout", body)
        elif kind == "exit":
            bound = turn_memory_bytes(self.policy.limits)
            self._finish(call_id, exec_result(item, header, bound))
        else:
            return False
        return True

    def _read_detached(
        self, call_id: int, item: Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> bool:
        """A detached process runs (``started``), its log, or it was refused or exited."""
        if kind == "started":
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                item.started.set_result(None)
        elif kind == "out":
            item.add_output(body)
        elif kind == "exit":
            end = detached_result(item, header, turn_memory_bytes(self.policy.limits))
            if isinstance(end, BaseException):
                self._finish(call_id, exception=end)
            else:
                self._finish(call_id, end)
        else:
            return False
        return True

    def _read_nothing(
        self, call_id: int, item: Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> bool:
        """A file request is answered in one frame (``ANSWERS``); nothing streams."""
        return False

    def _finish(
        self, call_id: int, result: object = None, *, exception: BaseException | None = None
    ) -> None:
        with self._lock:
            item = self._pending.pop(call_id, None)
        if item is not None:
            self._settle(item, result=result, exception=exception)

    def _on_exit(self, call_id: int, item: Pending, header: dict[str, Any]) -> None:
        item.exit = header
        entries = header.get("files") or ()
        if len(entries) > _OUTBOX_FILES_PER_CALL:
            raise _protocol.ProtocolError(f"{len(entries)} outbox files announced for one call")
        for reason, count in header.get("skipped") or ():
            if isinstance(reason, str) and isinstance(count, int):
                item.skipped[reason[:200]] = item.skipped.get(reason[:200], 0) + count
        for entry in entries:
            name, size = entry.get("name"), entry.get("size")
            if not isinstance(name, str) or name in {"", ".", ".."} or "/" in name or "\0" in name:
                raise _protocol.ProtocolError(f"outbox file name {name!r} is not a plain name")
            if not isinstance(size, int) or size < 0:
                raise _protocol.ProtocolError(f"outbox file size {size!r} is not a size")
            item.expected.append((name, size, self._budget_outbox(item, size)))
        self._next_file(call_id, item)

    def _budget_outbox(self, item: Pending, size: int) -> bool:
        """Count one announced file against the turn's budget; False if it is not kept."""
        with self._lock:
            if self._outbox_files >= OUTBOX_FILES_PER_TURN:
                reason = PAST_TURN_FILES
            elif self._outbox_bytes + size > OUTBOX_BYTES_PER_TURN:
                reason = PAST_TURN_BYTES
            else:
                self._outbox_files += 1
                self._outbox_bytes += size
                return True
        item.skipped[reason] = item.skipped.get(reason, 0) + 1
        return False

    def _next_file(self, call_id: int, item: Pending) -> None:
        """Open the next expected outbox file; resolve the call when none is left."""
        while item.expected:
            name, size, keep = item.expected[0]
            item.current_written = 0
            if keep:
                try:
                    outbox = outbox_of(item)
                    outbox.mkdir(parents=True, exist_ok=True)
                    item.current = (outbox / name).open("wb")
                except OSError as exc:
                    # The host's disk, not the call: drop this file, keep the session.
                    self._host_write_failed(item, exc)
            if size:
                return
            self._file_done(item)
        self._finish(call_id, run_outcome(item, turn_memory_bytes(self.policy.limits)))

    @staticmethod
    def _host_write_failed(item: Pending, exc: OSError) -> None:
        name, size, _ = item.expected[0]
        item.expected[0] = (name, size, False)
        if item.current is not None:
            with contextlib.suppress(OSError):
                item.current.close()
            item.current = None
            with contextlib.suppress(OSError):
                (outbox_of(item) / name).unlink()
        item.skipped[NOT_WRITTEN] = item.skipped.get(NOT_WRITTEN, 0) + 1
        item.unwritten = str(exc.strerror or exc)

    def _file_done(self, item: Pending) -> None:
        name, size, keep = item.expected.popleft()
        if item.current is not None:
            item.current.close()
            item.current = None
        if keep:
            file = OutboxFile(name=name, size=size, path=outbox_of(item) / name)
            item.files.append(self._turn_outbox.adopt(file))

    def _on_file_chunk(self, call_id: int, item: Pending, body: bytes) -> None:
        if not item.expected:
            raise _protocol.ProtocolError("outbox data for no announced file")
        name, size, _ = item.expected[0]
        if item.current_written + len(body) > size:
            raise _protocol.ProtocolError(f"outbox file {name!r} is longer than announced")
        if item.current is not None:
            try:
                item.current.write(body)
            except OSError as exc:
                self._host_write_failed(item, exc)
        item.current_written += len(body)
        if item.current_written == size:
            self._file_done(item)
            self._next_file(call_id, item)

    # The replies' readers, by their names from before ``_replies`` (tests call them).
    _outcome = staticmethod(run_outcome)
    _exec_result = staticmethod(exec_result)

    # -- requests ----------------------------------------------------------------

    def _submit(self, request: _Request) -> tuple[int, Pending]:
        """Send ``request`` as its kind's message (``_requests.MESSAGES``); return its id
        and what waits for its answer."""
        message, body, item = MESSAGES[type(request)](request)
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            raise SandboxError(self._owner.refusal(f"this {self.backend} sandbox"))
        with self._lock:
            if self._closed:
                raise SandboxError(f"the {self.backend} sandbox session is closed")
            if self._dead is not None:
                raise SandboxError(self._dead)
            call_id = self._next_id
            self._next_id += 1
            # Touched now: no fork's layer may come after (the server refuses it anyway).
            spent = None if isinstance(request, AdoptRequest) else self.adopt_socket
            self.adopt_socket = None if spent is not None else self.adopt_socket
            if item.kind == "run":
                item.outbox = self._turn_outbox.root() / f"call-{call_id}"
            self._pending[call_id] = item
        if spent is not None:
            spent.close()
        try:
            # Checked before sending: a frame the server must refuse would end the session.
            frame = _protocol.encode(message.to_json(call_id), body)
        except _protocol.FrameTooLarge as exc:
            self._finish(call_id)
            raise SandboxError(f"the request is too large to send to the sandbox ({exc})") from None
        try:
            self._send(frame)
        except SandboxError:
            self._finish(call_id)
            raise
        return call_id, item

    def _detached(self, call_id: int, item: Pending, request: DetachRequest) -> DetachedProcess:
        def kill() -> None:
            with contextlib.suppress(SandboxError):
                self._send(_protocol.encode(Cancel().to_json(call_id)))

        return DetachedProcess(request.argv, item.future, kill)

    def _stuck(self, call_id: int, waited: float) -> SandboxError:
        message = self._death(
            f"the sandbox server did not answer request {call_id} within {waited:g} s"
        )
        self._channel.close()
        return SandboxError(message)

    def _wait(self, call_id: int, item: Pending, limit: float) -> Any:
        try:
            return item.future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise self._stuck(call_id, limit) from None

    async def _await(self, call_id: int, item: Pending, limit: float) -> Any:
        try:
            return await wait_future(item.future, limit)
        except TimeoutError:
            raise self._stuck(call_id, limit) from None
        except cancelled_exception():  # on whichever event loop is running: kill the call
            self._cancel(call_id)
            raise

    def _cancel(self, call_id: int) -> None:
        with self._lock:
            item = self._pending.pop(call_id, None)
        if item is None:
            return
        self._settle(item, exception=SandboxError("cancelled"))
        with contextlib.suppress(SandboxError):
            self._send(_protocol.encode(Cancel().to_json(call_id)))

    def adopt(self, layer: int, timeout: float, below: Sequence[int] = ()) -> None:
        """Lay this fresh sandbox's workspace on a fork's frozen layer (the descriptor
        ``layer``, the host's to close), as a fork's own sandbox would have at its start.
        ``below``: the layers under it, top first, where the fork's files are a stack (a
        fork of a fork's), as ``Policy.workspace_below_fds`` are at a hello.

        Once only, and only before any other request (the server refuses it after one):
        raises ``SandboxError`` where it was not laid, and the sandbox must then be
        closed, never serve the fork. Started without ``Policy.adoptable``, it raises too.
        Where the host can lay the overlay itself (``adopt_laid``: root's Docker host), a
        fork's files go that way (``_executor._adopt``): a layer passed here is laid by
        the container's server, which reads no ``trusted.*`` whiteout of root's layers.
        """
        with self._lock:
            sock, self.adopt_socket = self.adopt_socket, None
        if sock is None:
            raise SandboxError(f"this {self.backend} sandbox cannot be adopted by a fork")
        try:
            fitted = self._fitted((layer, *below))
        except OSError as exc:
            sock.close()
            raise SandboxError(f"the fork's layer cannot be made this sandbox's ({exc})") from None
        try:
            # The layers wait on the socket, in one message, before the request naming them.
            socket.send_fds(sock, [b"L"], list(fitted))
        except OSError as exc:
            raise SandboxError(f"cannot pass the fork's layer to the sandbox ({exc})") from None
        finally:
            sock.close()
            if self.fit_layer is not None:
                for fd in fitted:
                    os.close(fd)
        reply = cast(FsReply, self._ask(AdoptRequest(timeout=timeout)))
        if reply.errno is not None:
            raise SandboxError(
                f"the {self.backend} sandbox refused the fork's layer: {reply.errno}: "
                f"{reply.message}"
            )
        relaxations = dict(self.ready_info.get("relaxations") or {}, workspace_lower=True)
        self.ready_info = {**self.ready_info, "relaxations": relaxations}

    def adopt_laid(self, lower: str | tuple[str, ...], timeout: float) -> None:
        """Lay this fresh sandbox's workspace on a fork's files from the host (``lower``:
        the snapshot's tree, or its stack of layers, top first), where the host lays the
        overlay itself (``lay_adoption``: root's Docker host, whose layers' whiteouts the
        container's own overlay would not read), then have the server make its outbox and
        views on it (``AdoptRequest.laid``). The host's overlay lists the fork's own names
        (``upper_names``), and a freeze stacks its layer. Raises ``SandboxError`` as
        ``adopt`` does: the sandbox must then be closed."""
        with self._lock:
            sock, self.adopt_socket = self.adopt_socket, None
        if sock is None or self.lay_adoption is None:
            if sock is not None:
                sock.close()
            raise SandboxError(f"this {self.backend} sandbox cannot be adopted by a fork")
        try:
            overlay = self.lay_adoption(self, lower, timeout=timeout)
        except OSError as exc:
            raise SandboxError(
                f"the fork's overlay cannot be laid for the sandbox ({exc})"
            ) from None
        finally:
            sock.close()  # nothing goes on it: the server finds it empty
        self._laid_overlay = overlay
        reply = cast(FsReply, self._ask(AdoptRequest(timeout=timeout, laid=True)))
        if reply.errno is not None:
            raise SandboxError(
                f"the {self.backend} sandbox refused the host's overlay: {reply.errno}: "
                f"{reply.message}"
            )
        self.upper_names = overlay.upper_names
        relaxations = dict(self.ready_info.get("relaxations") or {}, workspace_lower=True)
        self.ready_info = {**self.ready_info, "relaxations": relaxations}

    def _fitted(self, layers: tuple[int, ...]) -> tuple[int, ...]:
        """``layers`` as this sandbox takes them: each fitted (``fit_layer``: new
        descriptors, the caller's to close), or themselves where nothing fits them. A
        stack's layers are fitted one by one, as a cold fork's are at its start; where one
        cannot be, those made already are closed and the ``OSError`` raised."""
        if self.fit_layer is None:
            return layers
        fitted: list[int] = []
        try:
            for layer in layers:
                fitted.append(self.fit_layer(layer))
        except OSError:
            for fd in fitted:
                os.close(fd)
            raise
        return tuple(fitted)

    def _ask(self, request: RunRequest | ExecRequest | FsRequest | AdoptRequest) -> Any:
        """Send ``request``; wait for its answer as long as its timeout and a grace."""
        call_id, item = self._submit(request)
        return self._wait(call_id, item, request.timeout + _ANSWER_GRACE)

    async def _aask(self, request: RunRequest | ExecRequest | FsRequest | AdoptRequest) -> Any:
        """Async twin of ``_ask``; cancelling it kills the request."""
        call_id, item = self._submit(request)
        return await self._await(call_id, item, request.timeout + _ANSWER_GRACE)

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one confined call in the sandbox and wait for it."""
        return cast(RunOutcome, self._ask(request))

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``; cancelling it kills the call."""
        return cast(RunOutcome, await self._aask(request))

    def exec(self, request: ExecRequest) -> ExecResult:
        """Run a host's command in the sandbox, its streams apart, and wait for it."""
        return cast(ExecResult, self._ask(request))

    async def aexec(self, request: ExecRequest) -> ExecResult:
        """Async twin of ``exec``; cancelling it kills the command."""
        return cast(ExecResult, await self._aask(request))

    def fs(self, request: FsRequest) -> FsReply:
        """Run one file primitive in the sandbox's view, as the calls' user."""
        return self._with_upper_names(request, cast(FsReply, self._ask(request)))

    async def afs(self, request: FsRequest) -> FsReply:
        """Async twin of ``fs``."""
        return self._with_upper_names(request, cast(FsReply, await self._aask(request)))

    def _with_upper_names(self, request: FsRequest, reply: FsReply) -> FsReply:
        """A snapshot's listing with the names the host read in the upper layer, read once
        the listing is in: a file changed meanwhile is then found changed."""
        listing = request.op == "pack" and request.fields.get("phase") == "list"
        if self.upper_names is None or not listing or reply.errno is not None:
            return reply
        names = self.upper_names()
        # Unknown (None) is said as such: no name may then be taken for the lower layer's.
        return attrs.evolve(
            reply,
            upper_names=frozenset() if names is None else names,
            upper_read=names is not None,
        )

    def detach(self, request: DetachRequest) -> DetachedProcess:
        """Start a detached process; return once the server says it runs."""
        call_id, item = self._submit(request)
        try:
            item.started.result(timeout=_ANSWER_GRACE)
        except concurrent.futures.TimeoutError:
            raise self._stuck(call_id, _ANSWER_GRACE) from None
        return self._detached(call_id, item, request)

    async def adetach(self, request: DetachRequest) -> DetachedProcess:
        """Async twin of ``start``."""
        call_id, item = self._submit(request)
        process = self._detached(call_id, item, request)
        try:
            await wait_future(item.started, _ANSWER_GRACE)
        except TimeoutError:
            raise self._stuck(call_id, _ANSWER_GRACE) from None
        except cancelled_exception():  # nobody will hold the handle: do not leave it running
            process.kill()
            raise
        return process

    # -- end ---------------------------------------------------------------------

    def close(self) -> None:
        """Ask the server to stop, kill the sandbox, fail what is pending. Never raises.

        In a forked child it only marks the session closed: the sandbox, its
        pipes and its outbox are the parent's (``_owner``).
        """
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            alive = self._dead is None
        if alive and self._reader.is_alive():
            with contextlib.suppress(Exception):
                self._send(_protocol.encode(Shutdown().to_json()))
            # Let the server kill its calls itself (it knows their process groups), briefly.
            self._reader.join(timeout=2.0)
        with contextlib.suppress(Exception):
            self._channel.close()
        if self._reader.ident is not None:
            self._reader.join(timeout=5.0)
        self._fail_all(f"the {self.backend} sandbox session was closed")
        self._turn_outbox.close()
        sock, self.adopt_socket = self.adopt_socket, None
        if sock is not None:
            sock.close()
        overlay, self._laid_overlay = self._laid_overlay, None
        if overlay is not None:
            overlay.close()  # the container is gone, or going: its mount with it


def _passed_with_hello(policy: Policy, options: ServerOptions) -> tuple[int, ...]:
    """The descriptors the hello carries over the channel, in the order the server takes
    them (``server/_main``): the frozen layer (a stack's top, then its layers below it),
    then the adoption socket."""
    lower = policy.workspace_lower_fd if options.pass_lower_fd else None
    below = policy.workspace_below_fds if lower is not None else ()
    adopt = options.adopt_socket if options.pass_adopt_socket else None
    return tuple(fd for fd in (lower, *below, adopt) if fd is not None)


#: Each kind of request's reader of the frames that come while it runs: True if it took it.
_STREAM_READERS: Mapping[
    str, Callable[[ServerSession, int, Pending, str, dict[str, Any], bytes], bool]
] = {
    "run": ServerSession._read_run,
    "exec": ServerSession._read_exec,
    "detach": ServerSession._read_detached,
    "fs": ServerSession._read_nothing,
}
