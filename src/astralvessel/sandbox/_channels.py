"""Channels: the byte pipes through which the library speaks to a sandbox server.

A backend opens one ``Channel`` per turn (see ``_base.Sandbox.open``). Most
backends start a process whose stdin and stdout are the server's own (bwrap,
nsjail, the unconfined host process, a third party's launcher), and
``PipeChannel`` is that channel, ready to reuse. Docker's channels (a unix
socket of the turn's own, or the engine's attach stream) live in ``docker/``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO

from ..errors import SandboxError
from ._lifeline import on_lifeline

__all__ = ["PipeChannel"]

#: Bytes of a sandbox's stderr kept to explain its death; the rest is dropped as it comes.
_STDERR_TAIL = 64 * 1024


class PipeChannel:
    """A ``Channel`` over a child process's stdin and stdout; its stderr feeds ``describe_exit``.

    The process is started in a new session, and ``close`` kills its whole
    process group, so whatever the backend's launcher started goes with it.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        *,
        name: str,
        cleanup: Callable[[], None] | None = None,
        explain: Callable[[], str] | None = None,
    ) -> None:
        if process.stdin is None or process.stdout is None or process.stderr is None:
            raise ValueError("PipeChannel needs a process with stdin, stdout and stderr pipes")
        self.process = process
        self.name = name
        self._cleanup = cleanup
        #: What the backend knows of a death beyond the exit status (a memory group's OOM kills).
        self._explain = explain
        self._stdin = process.stdin.fileno()
        self._stdout = process.stdout.fileno()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._tail_lock = threading.Lock()
        self._closed = False
        self._close_lock = threading.Lock()
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr, args=(process.stderr,), name=f"{name}-stderr", daemon=True
        )
        self._stderr_thread.start()

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        pass_fds: Iterable[int] = (),
        cleanup: Callable[[], None] | None = None,
        explain: Callable[[], str] | None = None,
    ) -> PipeChannel:
        """Start ``argv`` with piped stdin, stdout and stderr, in its own session."""

        def popen() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                env=None if env is None else dict(env),
                cwd=cwd,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )

        try:
            # Forked on the lifeline thread: a parent-death signal then follows this
            # process, not the thread that happened to open the turn.
            process = on_lifeline(popen)
        except OSError as exc:
            if cleanup is not None:
                cleanup()
            raise SandboxError(f"cannot start the {name} sandbox ({argv[0]}): {exc}") from exc
        return cls(process, name=name, cleanup=cleanup, explain=explain)

    def _drain_stderr(self, stream: IO[bytes]) -> None:
        # A ring of the last bytes: enough to explain a death, never unbounded.
        while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
            with self._tail_lock:
                self._tail.append(chunk)
                self._tail_size += len(chunk)
                while self._tail_size - len(self._tail[0]) >= _STDERR_TAIL:
                    self._tail_size -= len(self._tail.popleft())

    def stderr_tail(self) -> str:
        """The last bytes the process wrote to stderr, decoded."""
        with self._tail_lock:
            data = b"".join(self._tail)[-_STDERR_TAIL:]
        return data.decode("utf-8", "replace")

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the process's stdin."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._stdin, view) :]

    def recv(self, size: int) -> bytes:
        """Read up to ``size`` bytes of the process's stdout; ``b""`` at end of stream."""
        return os.read(self._stdout, size)

    def describe_exit(self) -> str:
        """Say how the process ended (waiting a moment for it) and what it last wrote to stderr."""
        try:
            code = self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            status = "is still running"
        else:
            if code < 0:
                try:
                    signame = signal.Signals(-code).name
                except ValueError:
                    signame = f"signal {-code}"
                status = f"was killed by {signame}"
            else:
                status = f"exited with status {code}"
        self._stderr_thread.join(timeout=1.0)
        tail = self.stderr_tail().strip()
        lines = tail.splitlines()[-20:]
        text = f"the {self.name} sandbox {status}"
        if self._explain is not None:
            with contextlib.suppress(Exception):
                note = self._explain()
                text += f", {note}" if note else ""
        return text + (":\n" + "\n".join(lines) if lines else " (no diagnostics on stderr)")

    def close(self) -> None:
        """Kill the process group, reap it, release the pipes and run the backend's cleanup."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=10.0)
        self._stderr_thread.join(timeout=2.0)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[union-attr]
        if self._cleanup is not None:
            with contextlib.suppress(Exception):
                self._cleanup()
