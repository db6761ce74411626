"""One ``docker exec`` of the ``docker-exec`` backend, holding an engine place until it runs.

The engine answers an exec's start request before ``runc exec`` has run, so a
bound around the requests alone let 128 turns' execs pile up inside the
engine, where some first calls outlasted their whole timeout before they ran.
So an exec holds one of the engine's ``runc`` places (``_gate``) from its
request until its command's first bytes: every command the host sends writes
``READY`` first (``_spec``), which the host strips. A call's own timeout starts
then; the wait before is bounded by the backend's ``start_timeout`` and fails
as one ``SandboxError``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...errors import SandboxError
from ._attach import TIMED_OUT, BrokenStream, close_attached, frames, raw_socket, read_ahead
from ._spec import READY

__all__ = ["ExecStream", "take_ready"]


def take_ready(seen: bytes, piece: bytes) -> tuple[bytes, bytes, bool]:
    """Match ``piece`` of stdout against ``READY`` after ``seen`` of it.

    Returns what of ``READY`` is now seen, what of ``piece`` is output, and
    whether the exec runs. The pair may come split; anything else first is
    output (an engine's own message about an exec it could not run).
    """
    take = piece[: len(READY) - len(seen)]
    if not READY.startswith(seen + take):
        return READY, seen + piece, True
    seen += take
    return seen, piece[len(take) :], len(seen) == len(READY)


class ExecStream:
    """One exec's stream, holding a ``runc`` place of the engine from its request until it runs.

    ``read(timeout)`` yields (stream, payload) without the ``READY`` pair, then
    ``TIMED_OUT`` once the command has run ``timeout`` seconds. If the command
    has not run by ``start_by`` (a ``time.monotonic`` value), or its stream
    breaks (reset, or cut inside a frame), ``read`` raises ``SandboxError``; so
    does the start when the engine refuses it.
    """

    def __init__(
        self, api: Any, container: str, argv: list[str], *, start_by: float, **options: Any
    ) -> None:
        self._start_by = start_by
        #: When the command ran (its first byte, or the end of a stream that had none).
        self.running_at: float | None = None
        self._due: float | None = None
        try:
            self._slot = api.runc_slot(start_by)
        except TimeoutError as exc:
            raise SandboxError(f"the docker engine was too busy to start the exec: {exc}") from None
        try:
            raw = api.ungated
            self.exec_id: str = raw.exec_create(container, argv, **options)["Id"]
            self.attached = raw.exec_start(self.exec_id, socket=True)
        except BaseException:
            self._slot.release()
            raise
        self.sock = raw_socket(self.attached)
        #: The stream's first bytes, if the SDK read them with the engine's answer.
        self._first = read_ahead(self.attached)

    def _running(self, timeout: float | None) -> None:
        self.running_at = time.monotonic()
        self._due = None if timeout is None else self.running_at + timeout
        self._slot.release()

    def read(self, timeout: float | None = None) -> Iterator[tuple[int, bytes]]:
        """The exec's output pieces after ``READY``, until its end or ``timeout`` after it ran."""
        try:
            yield from self._read(timeout)
        except BrokenStream as exc:
            # What came before the break is not the whole output: never a (truncated) success.
            raise SandboxError(
                f"the docker engine's stream of the exec's output broke: {exc}"
            ) from None

    def _read(self, timeout: float | None) -> Iterator[tuple[int, bytes]]:
        # READY is looked for on stdout until it (or other output) comes there, whatever
        # came on stderr first: the engine copies each stream on its own, so under load an
        # exec's first stderr (``Turn.exec``'s streams are apart) can overtake the READY
        # its shell wrote to stdout before, which then reached the host as output.
        marker = b""
        ready = False

        def due() -> float | None:
            return self._start_by if self.running_at is None else self._due

        for kind, piece in frames(self.sock, deadline=due, first=self._first):
            if kind == TIMED_OUT:
                if self.running_at is None:
                    raise SandboxError(
                        "the docker engine did not start the exec within the backend's "
                        "start_timeout (it is overloaded; open fewer turns at once, or use "
                        "the docker backend)"
                    )
                yield kind, piece
                return
            payload = piece
            if kind == 1 and not ready:
                marker, payload, ready = take_ready(marker, piece)
                if not ready:
                    continue
            if self.running_at is None:
                # Bytes on either stream: the exec runs, and its own timeout starts.
                self._running(timeout)
            if payload:
                yield kind, payload
        if self.running_at is None:
            self._running(timeout)

    def close(self) -> None:
        """Give the place back if still held, and close the stream. Never raises."""
        self._slot.release()
        close_attached(self.attached)
