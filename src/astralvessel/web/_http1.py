"""A small sans-I/O HTTP/1.1 reader and writer shared by the sync and async stdlib transports.

It reads exactly what a client of one ``Connection: close`` exchange needs:
the status line and headers (bounded in size), then a body framed by
Content-Length, chunked transfer coding, or the end of the connection. As in
h11, the head decides the framing and a table (`READERS`) turns the framing
into one small reader object per case; each reader takes what it can from
the buffer and says whether the body has ended.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

from ._transport import HttpRequest, TransportError

__all__ = ["READERS", "ResponseHead", "ResponseReader", "body_framing", "format_request"]

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: (.*))?$")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_CHUNK_LINE = 4096
_MAX_HEADERS = 256


def format_request(request: HttpRequest, *, host_header: str | None = None) -> bytes:
    """Serialize a request for the wire, with Host and Connection set by us."""
    lines = [f"{request.method} {request.target} HTTP/1.1"]
    host = f"[{request.host}]" if ":" in request.host else request.host
    default = {"http": 80, "https": 443}[request.scheme]
    lines.append(
        f"Host: {host_header or (host if request.port == default else f'{host}:{request.port}')}"
    )
    for name, value in request.headers:
        if name.lower() in ("host", "connection", "content-length", "transfer-encoding"):
            continue
        if any(c in name + value for c in "\r\n\0"):
            raise TransportError(f"request header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if request.body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(request.body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body


class ResponseHead:
    """The status line and headers of a response."""

    __slots__ = ("headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: tuple[tuple[str, str], ...]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers

    def get_all(self, name: str) -> list[str]:
        """Every value of a header, in order."""
        lowered = name.lower()
        return [value for key, value in self.headers if key.lower() == lowered]


# -- body readers: one per framing ------------------------------------------------------------


class BodyReader(Protocol):
    """Takes body bytes out of the connection's buffer for one kind of framing."""

    done: bool

    def __call__(self, buffer: bytearray, out: list[bytes]) -> None:
        """Move every body byte the buffer holds to ``out``, consuming the framing around it."""

    def read_eof(self) -> None:
        """The peer closed: end the body, or raise `TransportError` if it was cut short."""


def _cut_short() -> TransportError:
    return TransportError("the server closed the connection before the response body ended")


class NoBodyReader:
    """A response without a body: HEAD, 1xx, 204, 304, or ``Content-Length: 0``."""

    done = True

    def __call__(self, buffer: bytearray, out: list[bytes]) -> None:
        """There is nothing to take."""

    def read_eof(self) -> None:
        """Nothing was expected, so nothing is missing."""


class ContentLengthReader:
    """A body of exactly ``length`` bytes; bytes past it are not the body's."""

    def __init__(self, length: int) -> None:
        self._remaining = length
        self.done = length == 0

    def __call__(self, buffer: bytearray, out: list[bytes]) -> None:
        """Take up to the bytes still owed."""
        if self.done or not buffer:
            return
        self._remaining -= _take(buffer, self._remaining, out)
        self.done = self._remaining == 0

    def read_eof(self) -> None:
        """A close before the last byte is an error, never a silently short page."""
        if not self.done:
            raise _cut_short()


class ChunkedReader:
    """A chunked body: size lines, chunk data each followed by a line end, then trailers."""

    def __init__(self) -> None:
        self.done = False
        self._in_chunk = 0  # data bytes of the current chunk still to come
        self._chunk_open = False  # the line end after a chunk's data is still to come
        self._in_trailers = False

    def __call__(self, buffer: bytearray, out: list[bytes]) -> None:
        """Take whole chunks and partial chunk data until the buffer runs dry."""
        while not self.done:
            if self._in_chunk:
                if not buffer:
                    return
                self._in_chunk -= _take(buffer, self._in_chunk, out)
                continue
            line = _line(buffer)
            if line is None:
                return
            if self._in_trailers:
                self.done = not line.strip()
            elif self._chunk_open:
                if line.strip():
                    raise TransportError("the server sent a chunk longer than its stated size")
                self._chunk_open = False
            else:
                self._start_chunk(line)

    def _start_chunk(self, line: bytes) -> None:
        size_text = line.split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise TransportError("the server sent a malformed chunk size")
        self._in_chunk = int(size_text, 16)
        self._chunk_open = self._in_chunk > 0
        self._in_trailers = self._in_chunk == 0

    def read_eof(self) -> None:
        """A close before the last chunk and its trailers is an error."""
        if not self.done:
            raise _cut_short()


class UntilCloseReader:
    """A body without a length: everything until the peer closes."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self, buffer: bytearray, out: list[bytes]) -> None:
        """Everything in the buffer is body."""
        if buffer:
            out.append(bytes(buffer))
            buffer.clear()

    def read_eof(self) -> None:
        """The close is the end of the body."""
        self.done = True


def _take(buffer: bytearray, most: int, out: list[bytes]) -> int:
    """Move up to ``most`` bytes from the front of ``buffer`` to ``out``; how many moved."""
    piece = bytes(buffer[:most])
    del buffer[: len(piece)]
    out.append(piece)
    return len(piece)


def _line(buffer: bytearray) -> bytes | None:
    end = buffer.find(b"\n")
    if end < 0:
        if len(buffer) > _MAX_CHUNK_LINE:
            raise TransportError("the server sent an overlong line in a chunked body")
        return None
    line = bytes(buffer[:end])
    del buffer[: end + 1]
    return line.rstrip(b"\r")


#: The reader for each framing `body_framing` names, as h11 chooses its ``READERS``.
READERS: dict[str, Callable[..., BodyReader]] = {
    "none": NoBodyReader,
    "content-length": ContentLengthReader,
    "chunked": ChunkedReader,
    "until-close": UntilCloseReader,
}


def body_framing(method: str, head: ResponseHead) -> tuple[str, tuple[int, ...]]:
    """How the body after ``head`` is framed: a `READERS` key and the reader's arguments."""
    if method == "HEAD" or head.status in (204, 304) or head.status < 200:
        return "none", ()
    codings = [c.strip().lower() for v in head.get_all("transfer-encoding") for c in v.split(",")]
    codings = [c for c in codings if c]
    if codings:
        if codings[-1] != "chunked" or len(codings) > 1:
            raise TransportError(f"unsupported transfer encoding {', '.join(codings)!r}")
        return "chunked", ()
    lengths = {v.strip() for v in head.get_all("content-length")}
    if not lengths:
        return "until-close", ()
    if len(lengths) > 1 or not all(v.isdigit() and len(v) < 19 for v in lengths):
        raise TransportError("the server sent conflicting or invalid Content-Length headers")
    return "content-length", (int(lengths.pop()),)


# -- the response ---------------------------------------------------------------------------


class ResponseReader:
    """Feed it bytes as they arrive; it yields the head, then body bytes, then says it is done."""

    def __init__(self, *, method: str = "GET", max_header_bytes: int = 65536) -> None:
        self._method = method
        self._max_header_bytes = max_header_bytes
        self._buffer = bytearray()
        self._body: list[bytes] = []
        self._reader: BodyReader | None = None  # chosen once the head is in
        self.head: ResponseHead | None = None

    @property
    def done(self) -> bool:
        """Whether the whole response has been read."""
        return self._reader is not None and self._reader.done

    def feed(self, data: bytes) -> None:
        """Take more bytes from the connection."""
        self._buffer += data
        while self._reader is None:
            if not self._read_head():
                return
        self._reader(self._buffer, self._body)

    def feed_eof(self) -> None:
        """Note that the peer closed; raise `TransportError` if the response was cut short."""
        if self._reader is None:
            raise TransportError(
                "the server closed the connection before the response headers ended"
            )
        self._reader.read_eof()

    def take_body(self) -> bytes:
        """Return the body bytes decoded from framing since the last call."""
        if not self._body:
            return b""
        out = b"".join(self._body)
        self._body.clear()
        return out

    def _read_head(self) -> bool:
        match = _HEAD_END.search(self._buffer)
        if match is None:
            if len(self._buffer) > self._max_header_bytes:
                raise TransportError(
                    f"the response headers are larger than {self._max_header_bytes} bytes"
                )
            return False
        if match.end() > self._max_header_bytes:
            raise TransportError(
                f"the response headers are larger than {self._max_header_bytes} bytes"
            )
        raw = bytes(self._buffer[: match.start()])
        del self._buffer[: match.end()]
        head = _parse_head(raw)
        if 100 <= head.status < 200 and head.status != 101:
            return True  # an interim response; the real head follows
        self.head = head
        kind, arguments = body_framing(self._method, head)
        self._reader = READERS[kind](*arguments)
        return True


def _parse_head(raw: bytes) -> ResponseHead:
    lines = raw.split(b"\n")
    status_match = _STATUS_LINE.match(lines[0].rstrip(b"\r"))
    if status_match is None:
        raise TransportError("the server did not answer with an HTTP/1.x status line")
    status = int(status_match.group(1))
    reason = (status_match.group(2) or b"").decode("latin-1").strip()
    if len(lines) - 1 > _MAX_HEADERS:
        raise TransportError(f"the response has more than {_MAX_HEADERS} headers")
    headers: list[tuple[str, str]] = []
    for raw_line in lines[1:]:
        line = raw_line.rstrip(b"\r")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise TransportError("the server sent a malformed header line")
        headers.append((name.decode("latin-1"), value.strip().decode("latin-1")))
    return ResponseHead(status, reason, tuple(headers))
