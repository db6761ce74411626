"""A request the host waits on, as the session's reader thread fills it in.

One ``_Pending`` per request in flight: the futures its caller waits on, the
output it has kept (bounded again on the host, whatever the server sent), and
the outbox files still to come. The session (``_session``) owns the lock and
the pipe; this is only the request's own bookkeeping.
"""

from __future__ import annotations

import collections
import concurrent.futures
from pathlib import Path
from typing import IO, Any

from ._api import OutboxFile
from .server import _protocol

__all__ = ["Pending", "outbox_of"]


class Pending:
    """A request the host is waiting on; the reader thread fills it in."""

    def __init__(
        self, kind: str, output_chars: int = 0, outbox: Path | None = None, output_bytes: int = 0
    ) -> None:
        self.kind = kind
        #: An exec's streams, each bounded to ``output_bytes`` again on the host.
        self.output_bytes = output_bytes
        self.streams = {"stdout": bytearray(), "stderr": bytearray()}
        self.stream_cut = False
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        #: A detached process: settled when the server says it runs (or refused it).
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.output_chars = output_chars
        self.max_bytes = output_chars * 4
        self.output = bytearray()
        self.kept_chars = 0
        self.dropped_chars = 0
        self.cut = False
        self.outbox = outbox
        self.exit: dict[str, Any] | None = None
        self.files: list[OutboxFile] = []
        #: Announced outbox files still to come: name, size, and whether the host keeps it.
        self.expected: collections.deque[tuple[str, int, bool]] = collections.deque()
        self.current: IO[bytes] | None = None
        self.current_written = 0
        #: Outbox entries not returned, by reason (the server's and the turn's budget).
        self.skipped: dict[str, int] = {}
        #: Why the host could not write a file it was sent (the OS's words), if it could not.
        self.unwritten = ""

    def add_output(self, chunk: bytes) -> None:
        # The server already bounds what it streams; the host bounds it again, by characters
        # and by bytes (invalid UTF-8 can pack many bytes into one counted character).
        if not self.cut:
            index = _protocol.split_chars(chunk, self.output_chars - self.kept_chars)
            index = min(index, self.max_bytes - len(self.output))
            keep = chunk[:index]
            self.output += keep
            self.kept_chars += _protocol.count_chars(keep)
            if index == len(chunk):
                return
            self.cut = True
            chunk = chunk[index:]
        self.dropped_chars += _protocol.count_chars(chunk)

    def add_stream(self, stream: str, chunk: bytes) -> None:
        """An exec's output chunk: ``output_bytes`` kept per stream, whatever the server says."""
        kept = self.streams[stream]
        room = max(0, self.output_bytes - len(kept))
        kept += chunk[:room]
        if len(chunk) > room:
            self.stream_cut = True


def outbox_of(item: Pending) -> Path:
    if item.outbox is None:
        raise _protocol.ProtocolError("outbox files for a request that is not a run")
    return item.outbox
