"""A small sans-I/O HTTP/1.1 reader and writer shared by the sync and async stdlib transports.

It reads exactly what a client of one ``Connection: close`` exchange needs:
the status line and headers (bounded in size), then a body framed by
Content-Length, chunked transfer coding, or the end of the connection.
"""

from __future__ import annotations

import enum
import re

from ._transport import HttpRequest, TransportError

__all__ = ["ResponseHead", "ResponseReader", "format_request"]

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: (.*))?$")
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


class _State(enum.Enum):
    HEAD = "head"
    LENGTH = "length"
    CHUNK_SIZE = "chunk-size"
    CHUNK_DATA = "chunk-data"
    CHUNK_END = "chunk-end"
    TRAILERS = "trailers"
    UNTIL_CLOSE = "until-close"
    DONE = "done"


class ResponseReader:
    """Feed it bytes as they arrive; it yields the head, then body bytes, then says it is done."""

    def __init__(self, *, method: str = "GET", max_header_bytes: int = 65536) -> None:
        self._method = method
        self._max_header_bytes = max_header_bytes
        self._buffer = bytearray()
        self._state = _State.HEAD
        self._remaining = 0
        self._body: list[bytes] = []
        self.head: ResponseHead | None = None

    @property
    def done(self) -> bool:
        """Whether the whole response has been read."""
        return self._state is _State.DONE

    def feed(self, data: bytes) -> None:
        """Take more bytes from the connection."""
        self._buffer += data
        self._advance()

    def feed_eof(self) -> None:
        """Note that the peer closed; raise `TransportError` if the response was cut short."""
        if self._state is _State.UNTIL_CLOSE:
            self._state = _State.DONE
        elif self._state is not _State.DONE:
            where = "headers" if self._state is _State.HEAD else "body"
            raise TransportError(
                f"the server closed the connection before the response {where} ended"
            )

    def take_body(self) -> bytes:
        """Return the body bytes decoded from framing since the last call."""
        if not self._body:
            return b""
        out = b"".join(self._body)
        self._body.clear()
        return out

    def _advance(self) -> None:  # noqa: PLR0911, PLR0912 - one case per parser state
        while True:
            state = self._state
            if state is _State.HEAD:
                if not self._read_head():
                    return
            elif state is _State.LENGTH:
                if not self._buffer:
                    return
                piece = bytes(self._buffer[: self._remaining])
                del self._buffer[: len(piece)]
                self._remaining -= len(piece)
                self._body.append(piece)
                if self._remaining == 0:
                    self._state = _State.DONE
            elif state is _State.UNTIL_CLOSE:
                if self._buffer:
                    self._body.append(bytes(self._buffer))
                    self._buffer.clear()
                return
            elif state is _State.CHUNK_SIZE:
                line = self._line()
                if line is None:
                    return
                size_text = line.split(b";", 1)[0].strip()
                if not size_text or not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_text):
                    raise TransportError("the server sent a malformed chunk size")
                self._remaining = int(size_text, 16)
                self._state = _State.CHUNK_DATA if self._remaining else _State.TRAILERS
            elif state is _State.CHUNK_DATA:
                if not self._buffer:
                    return
                piece = bytes(self._buffer[: self._remaining])
                del self._buffer[: len(piece)]
                self._remaining -= len(piece)
                self._body.append(piece)
                if self._remaining == 0:
                    self._state = _State.CHUNK_END
            elif state is _State.CHUNK_END:
                line = self._line()
                if line is None:
                    return
                if line.strip():
                    raise TransportError("the server sent a chunk longer than its stated size")
                self._state = _State.CHUNK_SIZE
            elif state is _State.TRAILERS:
                line = self._line()
                if line is None:
                    return
                if not line.strip():
                    self._state = _State.DONE
            else:
                return

    def _line(self) -> bytes | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > _MAX_CHUNK_LINE:
                raise TransportError("the server sent an overlong line in a chunked body")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line.rstrip(b"\r")

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
        if 100 <= status < 200 and status != 101:
            return True  # an interim response; the real head follows
        self.head = ResponseHead(status, reason, tuple(headers))
        self._choose_framing(self.head)
        return True

    def _choose_framing(self, head: ResponseHead) -> None:
        if self._method == "HEAD" or head.status in (204, 304) or head.status < 200:
            self._state = _State.DONE
            return
        codings = [
            c.strip().lower() for v in head.get_all("transfer-encoding") for c in v.split(",")
        ]
        codings = [c for c in codings if c]
        if codings:
            if codings[-1] != "chunked" or len(codings) > 1:
                raise TransportError(f"unsupported transfer encoding {', '.join(codings)!r}")
            self._state = _State.CHUNK_SIZE
            return
        lengths = {v.strip() for v in head.get_all("content-length")}
        if not lengths:
            self._state = _State.UNTIL_CLOSE
            return
        if len(lengths) > 1 or not all(v.isdigit() and len(v) < 19 for v in lengths):
            raise TransportError("the server sent conflicting or invalid Content-Length headers")
        self._remaining = int(lengths.pop())
        self._state = _State.LENGTH if self._remaining else _State.DONE
