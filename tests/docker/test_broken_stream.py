"""An exec stream that breaks (reset, or cut inside a frame) is an error, never a short success.

The frame reader is checked on real sockets; the whole path on a real engine,
reached through a TCP front (``EngineProxy``) that resets a running exec's
connection the way a failing network or engine does.
"""

from __future__ import annotations

import concurrent.futures
import re
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from astralvessel import Executor, Registry, ToolSpec
from astralvessel.sandbox.docker import Docker, DockerExec
from astralvessel.sandbox.docker._attach import BrokenStream, frames

from .conftest import BASE_IMAGE, NOPYTHON_IMAGE, SMALL_LIMITS

_HEADER = struct.Struct(">BxxxI")
#: How long the test waits for what it needs to see; a guard against a hang, not a measure.
_PATIENCE = 120.0


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (``SO_LINGER`` of zero), not an orderly end."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_all(sock: socket.socket) -> list[tuple[int, bytes]]:
    return list(frames(sock))


def test_a_reset_connection_is_a_broken_stream_not_its_end() -> None:
    """A frame, then a TCP reset: the frame arrives, then the reader raises naming the reset."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    with ours:
        theirs.sendall(_HEADER.pack(1, 3) + b"abc")
        pieces = []
        reader = frames(ours)
        pieces.append(next(reader))
        _reset(theirs)
        with pytest.raises(BrokenStream, match="ECONNRESET"):
            pieces.extend(reader)
    assert pieces == [(1, b"abc")]


def test_a_stream_cut_inside_a_frame_is_broken() -> None:
    """An orderly end inside a payload or a header is a short frame, said as such."""
    for sent, why in [
        (_HEADER.pack(1, 10) + b"abc", "7 bytes short of a frame's payload"),
        (_HEADER.pack(1, 2) + b"ok" + _HEADER.pack(2, 5)[:3], r"header \(3 of 8 bytes\)"),
    ]:
        ours, theirs = socket.socketpair()
        with ours:
            theirs.sendall(sent)
            theirs.close()
            with pytest.raises(BrokenStream, match=why):
                _read_all(ours)


def test_a_whole_stream_ends_quietly() -> None:
    """Whole frames then an orderly end: every payload, no error."""
    ours, theirs = socket.socketpair()
    with ours:
        theirs.sendall(_HEADER.pack(1, 2) + b"ok" + _HEADER.pack(2, 0) + _HEADER.pack(2, 1) + b"!")
        theirs.close()
        assert _read_all(ours) == [(1, b"ok"), (2, b"!")]


class _Link:
    """One client connection forwarded to the engine; it may be reset on request."""

    def __init__(self, client: socket.socket, engine: socket.socket) -> None:
        self.client = client
        self.engine = engine
        #: Whether this connection carries an exec's stream (it asked the engine to start one).
        self.exec_stream = False
        #: Whether this connection carries a container's attach stream.
        self.attach_stream = False
        #: What the engine sent the client since the exec started (or the attach).
        self.answer = bytearray()
        self.reset = threading.Event()
        self.done = threading.Event()
        #: Once the engine's answer holds this, the client gets up to its first byte, then
        #: an orderly end: the frame that carried it is cut short.
        self.cut_at: bytes | None = None

    def serve(self) -> None:
        """Forward both ways until both ends close, or reset the client when asked."""
        selector = selectors.DefaultSelector()
        ends = {self.client: self.engine, self.engine: self.client}
        for sock in ends:
            selector.register(sock, selectors.EVENT_READ)
        try:
            while ends and not self.reset.is_set():
                for key, _ in selector.select(timeout=0.1):
                    source = key.fileobj
                    assert isinstance(source, socket.socket)
                    self._forward(source, ends, selector)
            if self.reset.is_set():
                _reset(self.client)
        except OSError:
            pass
        finally:
            selector.close()
            for sock in (self.client, self.engine):
                sock.close()
            self.done.set()

    def _forward(
        self,
        source: socket.socket,
        ends: dict[socket.socket, socket.socket],
        selector: selectors.BaseSelector,
    ) -> None:
        data = source.recv(65536)
        target = ends[source]
        if not data:
            # A half close (the exec's stdin ended) is passed on; the other way flows on.
            selector.unregister(source)
            del ends[source]
            target.shutdown(socket.SHUT_WR)
            return
        if source is self.client and re.match(rb"POST /\S*exec/\w+/start ", data):
            self.exec_stream = True
        elif source is self.client and re.match(rb"POST /\S*containers/\w+/attach", data):
            self.attach_stream = True
        elif source is self.engine and (self.exec_stream or self.attach_stream):
            before = len(self.answer)
            self.answer += data
            at = -1 if self.cut_at is None else self.answer.find(self.cut_at)
            if at >= 0:
                target.sendall(data[: max(0, at + 1 - before)])
                target.shutdown(socket.SHUT_WR)
                self.cut_at = None
                selector.unregister(source)
                del ends[source]
                return
        target.sendall(data)


class EngineProxy:
    """A TCP front of the local engine's socket that can reset a running exec's connection."""

    def __init__(self, engine_socket: str) -> None:
        self._engine_socket = engine_socket
        self._listener = socket.create_server(("127.0.0.1", 0))
        host, port = self._listener.getsockname()
        #: The ``base_url`` that reaches the engine through this front.
        self.url = f"tcp://{host}:{port}"
        self.links: list[_Link] = []
        self.cut_marker: bytes | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(self._engine_socket)
            link = _Link(client, engine)
            link.cut_at = self.cut_marker
            self.links.append(link)
            threading.Thread(target=link.serve, daemon=True).start()

    def reset_exec_showing(self, output: bytes) -> None:
        """Reset the connection of the running exec that has sent ``output``."""
        give_up = time.monotonic() + _PATIENCE
        while time.monotonic() < give_up:
            for link in list(self.links):
                if link.exec_stream and output in link.answer and not link.done.is_set():
                    link.reset.set()
                    assert link.done.wait(_PATIENCE)
                    return
            time.sleep(0.05)
        pytest.fail(f"no exec stream showed {output!r}")

    def cut_attach_streams_at(self, marker: bytes) -> None:
        """Cut short the frame of any attach stream, open or to come, that carries ``marker``."""
        self.cut_marker = marker
        for link in list(self.links):
            link.cut_at = marker

    def close(self) -> None:
        """Stop taking connections (those open end with their ends)."""
        self._listener.close()


@pytest.fixture
def proxy(docker_api: object) -> Iterator[EngineProxy]:
    """A resettable front of the local engine (the test engine listens on its Unix socket)."""
    import docker.constants

    front = EngineProxy(urlsplit(docker.constants.DEFAULT_UNIX_SOCKET).path)
    try:
        yield front
    finally:
        front.close()


SLOW = ToolSpec.command_tool("slow", "Print, then wait.", ["/bin/sh", "-c", "echo up; sleep 120"])


def test_a_call_whose_stream_is_reset_is_an_error_result(proxy: EngineProxy) -> None:
    """The engine's connection reset mid-call: the model reads an error naming the reset."""
    backend = DockerExec(image=NOPYTHON_IMAGE, pull=False, base_url=proxy.url)
    executor = Executor(Registry([SLOW]), sandbox=backend, limits=SMALL_LIMITS, timeout_seconds=300)
    with executor.turn() as turn, concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(turn.call, "slow", {})
        proxy.reset_exec_showing(b"up\n")
        result = running.result(timeout=_PATIENCE)
    assert result.is_error
    assert "ECONNRESET" in result.text
    assert "stream of the exec's output broke" in result.text


MARK = ToolSpec.command_tool(
    "mark", "Print a marker.", ["/bin/sh", "-c", "echo before; printf 'CUT-HERE and after'"]
)


def test_an_attach_stream_cut_inside_a_frame_is_an_error_result(proxy: EngineProxy) -> None:
    """A docker turn on the attach stream (no direct channel) whose stream ends inside a
    frame: the call's result is an error naming the short frame."""
    backend = Docker(base_image=BASE_IMAGE, pull=False, base_url=proxy.url, direct=False)
    executor = Executor(Registry([MARK]), sandbox=backend, limits=SMALL_LIMITS)
    proxy.cut_attach_streams_at(b"CUT-HERE")
    with executor.turn() as turn:
        result = turn.call("mark", {})
    assert result.is_error
    assert "ended inside a frame" in result.text
