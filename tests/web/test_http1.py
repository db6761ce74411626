"""The sans-I/O HTTP/1.1 reader: one body reader per framing, fed a byte at a time or all at once."""

from __future__ import annotations

import pytest

from astralvessel.errors import AstralVesselError
from astralvessel.web import TransportError
from astralvessel.web._http1 import (
    READERS,
    ChunkedReader,
    ContentLengthReader,
    NoBodyReader,
    ResponseHead,
    ResponseReader,
    UntilCloseReader,
    body_framing,
)


def _read(wire: bytes, *, step: int, method: str = "GET", eof: bool = False) -> ResponseReader:
    reader = ResponseReader(method=method)
    for start in range(0, len(wire), step):
        reader.feed(wire[start : start + step])
    if eof:
        reader.feed_eof()
    return reader


def _body(reader: ResponseReader) -> bytes:
    return reader.take_body()


@pytest.mark.parametrize("step", [1, 3, 1 << 20])
def test_content_length_body_ends_at_its_length(step: int) -> None:
    """A Content-Length body is exactly that many bytes; what follows is not the body."""
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA"
    reader = _read(wire, step=step)
    assert reader.done
    assert _body(reader) == b"hello"


@pytest.mark.parametrize("step", [1, 4, 1 << 20])
def test_chunked_body_with_extensions_and_trailers(step: int) -> None:
    """Chunks are joined, extensions ignored, and the body ends after the trailers."""
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    reader = _read(wire, step=step)
    assert reader.done
    assert _body(reader) == b"hello, world"


def test_chunked_body_is_not_done_before_its_trailers_end() -> None:
    """The last chunk alone does not end the body: the blank line after the trailers does."""
    reader = _read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n", step=1)
    assert not reader.done
    with pytest.raises(TransportError, match="before the response body ended"):
        reader.feed_eof()


def test_chunk_longer_than_stated_is_refused() -> None:
    """Data past a chunk's stated size is an error, not more body."""
    with pytest.raises(TransportError, match="longer than its stated size"):
        _read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", step=1)


@pytest.mark.parametrize("size", [b"zz", b"", b"12345678901234567", b"-1"])
def test_malformed_chunk_size_is_refused(size: bytes) -> None:
    """A chunk size that is not 1 to 16 hex digits is an error."""
    with pytest.raises(TransportError, match="malformed chunk size"):
        _read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n", step=64)


def test_overlong_chunk_line_is_refused() -> None:
    """A size line that never ends is refused once it passes 4 KB, not buffered forever."""
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(TransportError, match="overlong line"):
        reader.feed(b"1" * 5000)


def test_body_without_length_ends_at_close() -> None:
    """Without a length or chunking, the body is everything until the peer closes."""
    reader = _read(b"HTTP/1.1 200 OK\r\n\r\nsome text", step=2)
    assert not reader.done
    reader.feed_eof()
    assert reader.done
    assert _body(reader) == b"some text"


def test_short_content_length_body_is_an_error_at_close() -> None:
    """A close before Content-Length bytes arrived is an error, never a short page."""
    reader = _read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", step=1 << 20)
    with pytest.raises(TransportError, match="before the response body ended"):
        reader.feed_eof()


def test_close_during_headers_is_an_error() -> None:
    """A close before the head ended says the headers were cut short."""
    reader = _read(b"HTTP/1.1 200 OK\r\nContent-", step=4)
    with pytest.raises(TransportError, match="before the response headers ended"):
        reader.feed_eof()


def test_interim_response_is_skipped() -> None:
    """A 100 Continue head is passed over; the real head and body follow."""
    reader = _read(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", step=3
    )
    assert reader.head is not None
    assert reader.head.status == 200
    assert _body(reader) == b"ok"


@pytest.mark.parametrize(
    ("method", "status_line"),
    [("HEAD", b"200 OK"), ("GET", b"204 No Content"), ("GET", b"304 Not Modified")],
)
def test_responses_without_body_are_done_at_the_head(method: str, status_line: bytes) -> None:
    """HEAD answers, 204 and 304 have no body whatever their headers say."""
    wire = b"HTTP/1.1 " + status_line + b"\r\nContent-Length: 99\r\n\r\n"
    reader = _read(wire, step=1 << 20, method=method)
    assert reader.done
    assert _body(reader) == b""


def _head(*headers: tuple[str, str], status: int = 200) -> ResponseHead:
    return ResponseHead(status, "OK", headers)


@pytest.mark.parametrize(
    ("method", "head", "framing", "reader_type"),
    [
        ("HEAD", _head(("Content-Length", "5")), ("none", ()), NoBodyReader),
        ("GET", _head(("Content-Length", "0")), ("content-length", (0,)), ContentLengthReader),
        ("GET", _head(("Content-Length", "5")), ("content-length", (5,)), ContentLengthReader),
        ("GET", _head(("Transfer-Encoding", "chunked")), ("chunked", ()), ChunkedReader),
        ("GET", _head(), ("until-close", ()), UntilCloseReader),
    ],
)
def test_framing_picks_a_reader_from_the_table(
    method: str, head: ResponseHead, framing: tuple[str, tuple[int, ...]], reader_type: type
) -> None:
    """The head names one framing, and the table turns it into that framing's reader."""
    assert body_framing(method, head) == framing
    assert isinstance(READERS[framing[0]](*framing[1]), reader_type)


@pytest.mark.parametrize(
    "headers",
    [
        (("Content-Length", "5"), ("Content-Length", "6")),
        (("Content-Length", "-5"),),
        (("Content-Length", "9" * 19),),
        (("Transfer-Encoding", "gzip, chunked"),),
        (("Transfer-Encoding", "chunked, gzip"),),
    ],
)
def test_ambiguous_framing_is_refused(headers: tuple[tuple[str, str], ...]) -> None:
    """Conflicting lengths and transfer codings other than plain chunked are refused."""
    with pytest.raises(TransportError):
        body_framing("GET", _head(*headers))


def test_transport_error_is_the_librarys_and_an_os_error() -> None:
    """A framing error is one of the library's errors and the OSError a transport raises."""
    with pytest.raises(TransportError) as caught:
        _read(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", step=64)
    assert isinstance(caught.value, AstralVesselError)
    assert isinstance(caught.value, OSError)
