"""The engine's multiplexed streams: the attach channel to a turn's server, and exec streams.

Without a TTY the engine frames each chunk of a container's (or an exec's)
output with an 8-byte header naming the stream (1 stdout, 2 stderr) and the
payload length. ``AttachChannel`` carries the server's protocol on stdout and
keeps a bounded stderr tail; ``frames`` reads an exec's stream for the
``docker-exec``, yielding payloads as they arrive so no frame is ever held whole.
A stream that breaks (reset, broken pipe, or cut in the middle of a frame)
raises ``BrokenStream``: what came before its break is not the exec's whole
output, and a caller that took it as such would return a truncated success.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "TIMED_OUT",
    "AttachChannel",
    "BrokenStream",
    "close_attached",
    "frames",
    "raw_socket",
    "read_ahead",
]

#: Bytes of the server's stderr kept to explain a container's death.
_STDERR_TAIL = 16 * 1024
#: A pseudo stream number ``frames`` yields when its deadline passes.
TIMED_OUT = -1
_HEADER = struct.Struct(">BxxxI")


class BrokenStream(ConnectionError):
    """An exec's stream ended without its end: the message says how (reset, short frame)."""


def raw_socket(attached: Any) -> Any:
    """The socket under the SDK's attach object (a ``SocketIO`` locally, a channel over SSH)."""
    return getattr(attached, "_sock", attached)


def read_ahead(attached: Any) -> bytes:
    """The stream's bytes the SDK's HTTP reader took past the response's headers.

    The SDK hands back the socket under the buffered reader that parsed the
    engine's ``101`` answer. When the engine's first frames arrive with that
    answer (a fast exec on a busy host), the reader has already taken them into
    its buffer, and reading the socket alone loses them: a call's whole output
    came back empty. One ``read1`` without blocking returns that buffer (or, if
    it is empty, what the socket has now, which is the stream's too).
    """
    response = getattr(attached, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    read1 = getattr(reader, "read1", None)
    if read1 is None:
        return b""
    sock = raw_socket(attached)
    before = sock.gettimeout()
    sock.settimeout(0)
    try:
        return bytes(read1(65536) or b"")
    except (OSError, ValueError):
        return b""
    finally:
        sock.settimeout(before)


class AttachChannel:
    """A ``Channel`` over a container's attach stream: stdin in, demultiplexed stdout out.

    Stdout frames carry the server's protocol; stderr frames are kept as a
    bounded tail for ``describe_exit``.
    """

    def __init__(
        self,
        api: Any,
        container_id: str,
        attached: Any,
        *,
        engine: str,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._api = api
        #: Run once the engine has removed the container (the turn's uid lease goes back).
        self._on_close = on_close
        #: The turn's container.
        self.container_id = container_id
        self._sock = raw_socket(attached)
        self._attached = attached
        self._engine = engine
        self._pending = bytearray()
        self._stdout = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._closed = False
        self._lock = threading.Lock()
        self._pump_lock = threading.Lock()
        self._exit: str | None = None

    def send(self, data: bytes) -> None:
        """Write to the server's stdin."""
        self._sock.sendall(data)

    def recv(self, size: int) -> bytes:
        """Return up to ``size`` bytes of the server's stdout; ``b""`` only at end of stream."""
        while not self._stdout:
            if not self._fill():
                return b""
        data = bytes(self._stdout[:size])
        del self._stdout[:size]
        return data

    def _fill(self) -> bool:
        """Read one frame's worth; False at end of stream.

        Raises ``BrokenStream`` when the stream ends inside a frame (the turn is
        open), and ``OSError`` when reading fails.
        """
        while True:
            if len(self._pending) >= _HEADER.size:
                kind, length = _HEADER.unpack_from(self._pending)
                if len(self._pending) >= _HEADER.size + length:
                    payload = bytes(self._pending[_HEADER.size : _HEADER.size + length])
                    del self._pending[: _HEADER.size + length]
                    if kind == 1:
                        self._stdout += payload
                        return True
                    self._keep_stderr(payload)
                    continue
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                if self._closed:
                    return False
                raise
            if not chunk:
                if self._pending and not self._closed:
                    raise BrokenStream(
                        f"the attach stream ended inside a frame ({len(self._pending)} bytes "
                        "of it came)"
                    )
                return False
            self._pending += chunk

    def fileno(self) -> int:
        """The stream's socket, to wait on (``_direct`` reads the server's stderr from it)."""
        return int(self._sock.fileno())

    def pump(self) -> bool:
        """Take what the stream holds now, without waiting, into the tail; False at its end.

        With a direct channel this stream carries only the server's stderr (and
        anything the container printed before the server connected).
        """
        with self._pump_lock:
            try:
                chunk = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self._pending += chunk
            while len(self._pending) >= _HEADER.size:
                _, length = _HEADER.unpack_from(self._pending)
                if len(self._pending) < _HEADER.size + length:
                    break
                self._keep_stderr(bytes(self._pending[_HEADER.size : _HEADER.size + length]))
                del self._pending[: _HEADER.size + length]
            return True

    def _keep_stderr(self, payload: bytes) -> None:
        self._tail.append(payload)
        self._tail_size += len(payload)
        while self._tail_size > _STDERR_TAIL and len(self._tail) > 1:
            self._tail_size -= len(self._tail.popleft())

    def close(self) -> None:
        """Remove the container (killing everything in it) and close the stream. Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # No inspection first: it cost an engine round trip on every close, for a status
        # only a turn that had already failed reads, and such a turn read it while open.
        self._exit = "the turn's container was removed"
        removed = False
        try:
            self._api.remove_container(self.container_id, force=True)
            removed = True
        except Exception as exc:
            # Gone already (404) is removed; any other failure may leave it running.
            removed = getattr(getattr(exc, "response", None), "status_code", None) == 404
        with contextlib.suppress(Exception):
            self._sock.shutdown(socket.SHUT_RDWR)
        close_attached(self._attached)
        # A container the engine did not remove may still run as the turn's uid: then the
        # lease stays held until this process ends (the kernel drops it), never handed on.
        if self._on_close is not None and removed:
            with contextlib.suppress(Exception):
                self._on_close()

    def _exit_status(self) -> str:
        try:
            state = self._api.inspect_container(self.container_id)["State"]
        except Exception as exc:
            return f"the Docker engine ({self._engine}) did not answer: {exc}"
        if state.get("Running"):
            return "the container was still running"
        parts = [f"the container exited with status {state.get('ExitCode')}"]
        if state.get("OOMKilled"):
            parts.append("killed for using more memory than its limit")
        if state.get("Error"):
            parts.append(f"engine error: {state['Error']}")
        return ", ".join(parts)

    def host_pid(self) -> int:
        """The engine's host pid of the container's first process (the server), 0 if it
        does not run; as the engine's machine counts it (a remote engine's: another's)."""
        pid = self._api.inspect_container(self.container_id)["State"].get("Pid")
        return pid if isinstance(pid, int) else 0

    def widen_memory(self, extra: int) -> None:
        """Raise the container's memory bound (and its swap's, the same) by ``extra`` bytes:
        a workspace frozen in place stays charged to it (``ServerLink.widen_memory``)."""
        host = self._api.inspect_container(self.container_id)["HostConfig"]
        memory, swap = int(host.get("Memory") or 0), int(host.get("MemorySwap") or 0)
        if memory <= 0 or extra <= 0:
            return  # no bound to raise
        self._api.update_container(
            self.container_id,
            mem_limit=memory + extra,
            memswap_limit=swap + extra if swap > 0 else None,
        )

    def describe_exit(self) -> str:
        """Why the sandbox ended: the container's state and the server's stderr tail."""
        status = self._exit or self._exit_status()
        tail = b"".join(self._tail).decode("utf-8", "replace").strip()
        return f"{status}; stderr: {tail[-2000:]}" if tail else status


def frames(
    sock: Any,
    *,
    deadline: float | Callable[[], float | None] | None = None,
    first: bytes = b"",
) -> Iterator[tuple[int, bytes]]:
    """An exec's output as (stream number, payload piece) until end of stream or ``deadline``.

    Pieces are yielded as they arrive, so the host holds at most one read
    (64 KiB) however long a frame the engine announces. A callable deadline is
    asked before each wait (``docker-exec`` moves it once the exec runs).
    ``first`` is the stream's start already read (``read_ahead``).

    Raises ``BrokenStream`` when reading fails (``ECONNRESET``, ``EPIPE``, any
    other socket error) or the stream ends inside a frame's header or payload.
    """
    fixed = None if callable(deadline) else deadline
    when = deadline if callable(deadline) else (lambda: fixed)
    pending = bytearray(first)
    kind, left = 0, 0
    while True:
        while pending:
            if left == 0:
                if len(pending) < _HEADER.size:
                    break
                kind, left = _HEADER.unpack_from(pending)
                del pending[: _HEADER.size]
                continue
            piece = bytes(pending[:left])
            del pending[: len(piece)]
            left -= len(piece)
            yield kind, piece
        now_due = when()
        if now_due is not None:
            remaining = now_due - time.monotonic()
            if remaining <= 0:
                yield TIMED_OUT, b""
                return
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError as exc:
            raise BrokenStream(f"its connection failed ({_error_name(exc)})") from None
        if not chunk:
            if left:
                raise BrokenStream(f"it ended {left} bytes short of a frame's payload")
            if pending:
                raise BrokenStream(
                    f"it ended inside a frame's header ({len(pending)} of {_HEADER.size} bytes)"
                )
            return
        pending += chunk


def _error_name(exc: OSError) -> str:
    """``ECONNRESET: Connection reset by peer``, or the error's own text if it has no number."""
    code = errno.errorcode.get(exc.errno or 0)
    return f"{code}: {exc.strerror}" if code else str(exc) or type(exc).__name__


def close_attached(attached: Any) -> None:
    """Close an attach or exec stream: the SDK's wrapper and the socket under it. Never raises."""
    sock = raw_socket(attached)
    _release_response(attached)
    with contextlib.suppress(Exception):
        attached.close()
    with contextlib.suppress(Exception):
        sock.close()


def _release_response(attached: Any) -> None:
    """Close the HTTP response the SDK keeps alive on an attach socket (``_response``).

    Closed only with the socket under it, that response's finalizer later flushes a
    closed file, which Python 3.13 reports as an unraisable ``ValueError``.
    """
    response = getattr(attached, "_response", None) or getattr(
        raw_socket(attached), "_response", None
    )
    if response is not None:
        with contextlib.suppress(Exception):
            response.close()
