"""The sandbox server's wire format, shared by the host and the server (stdlib only, Python 3.8+).

A frame is ``struct "!II"`` (header length, body length), then the header as
UTF-8 JSON (always an object with a ``type``), then the body as raw bytes. The
header carries the message, the body carries bulk data (a call's stdin, an
output chunk, a chunk of an outbox file) so it never needs escaping.

Header text is the os module's text for paths: a byte that is not UTF-8 (a file
name's) travels as itself and arrives as ``os.fsdecode``'s escape for it
(U+DC80-U+DCFF, the ``surrogateescape`` error handler), so a name listed by one
side reaches the very same file when the other sends it back.

This module is sent to the sandbox as source and executed there, so it must
import nothing but the standard library and run on old interpreters.
"""

from __future__ import annotations

import struct

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "DETACHED_PER_TURN",
    "DETACH_NEEDS_NAMESPACES",
    "DETACH_TURN_FULL",
    "MAX_BODY",
    "MAX_HEADER",
    "PREFIX",
    "VERSION",
    "FrameDecoder",
    "FrameTooLarge",
    "ProtocolError",
    "count_chars",
    "encode",
    "split_chars",
]

#: Bumped whenever a message changes shape; the host refuses a server that says another.
VERSION = 2
PREFIX = struct.Struct("!II")
#: A header is a small JSON object; anything bigger is a broken or hostile peer.
MAX_HEADER = 1 << 20
#: Bodies are stdin, output chunks and outbox chunks; senders keep them far below this.
MAX_BODY = 1 << 26
#: Detached processes (``Turn.start``) a turn may hold at once: each counts until its
#: namespace is empty, whatever it forked, and the server refuses one more.
DETACHED_PER_TURN = 8
#: Why the server refused to start a detached process, as the ``exit`` frame's
#: ``refused`` says it (a fact: the host words the error): the turn holds
#: ``DETACHED_PER_TURN`` already, or the server gives calls no namespaces of their own.
DETACH_TURN_FULL = "turn_full"
DETACH_NEEDS_NAMESPACES = "needs_namespaces"


def _not_json(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


try:
    # The json module's C halves, without the module: ``import json`` pulls in ``re`` and
    # ``enum``, about a tenth of a cold turn start, and a frame header needs only these.
    # (The scanner and the encoder have taken the same arguments from 3.6 to 3.13.)
    from _json import encode_basestring, make_encoder, make_scanner

    class _Context:
        """What ``json.JSONDecoder()`` hands the C scanner: the same defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {
            "-Infinity": float("-inf"),
            "Infinity": float("inf"),
            "NaN": float("nan"),
        }.__getitem__

    _scan = make_scanner(_Context())  # type: ignore[arg-type] # typeshed wants a scanner
    # json.dumps(header, separators=(",", ":"), ensure_ascii=False) without the module.
    _encode = make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, True)

    def _dumps(value: object) -> str:
        return "".join(_encode(value, 0))

    def _loads(text: str) -> object:
        text = text.strip(" \t\n\r")
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("Expecting value") from None
        if end != len(text):
            raise ValueError(f"Extra data at {end}")
        return value

except ImportError:  # an interpreter without the accelerator: the module itself
    import json

    def _dumps(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def _loads(text: str) -> object:
        return json.loads(text)


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame."""


class FrameTooLarge(ProtocolError):
    """A frame to send would pass ``MAX_HEADER`` or ``MAX_BODY``; nothing was sent."""


def encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    """Return one frame holding ``header`` and ``body``.

    Raises ``FrameTooLarge`` rather than build a frame the peer must refuse (a
    refused frame ends the whole session). A file name's undecodable bytes
    (``os.fsdecode``'s escapes) are sent as those very bytes; any other lone
    surrogate, which no byte string decodes to, is sent as U+FFFD.
    """
    text = _dumps(header)
    try:
        head = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        head = _unescapable(text).encode("utf-8", "surrogateescape")
    if len(head) > MAX_HEADER:
        raise FrameTooLarge(f"frame header of {len(head)} bytes exceeds {MAX_HEADER}")
    if len(body) > MAX_BODY:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds {MAX_BODY}")
    return PREFIX.pack(len(head), len(body)) + head + body


def _unescapable(text: str) -> str:
    """``text`` with each lone surrogate that stands for no byte (not U+DC80-U+DCFF) as U+FFFD."""
    return "".join(
        "\ufffd" if "\ud800" <= c <= "\udfff" and not "\udc80" <= c <= "\udcff" else c for c in text
    )


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes as they arrive, take whole frames with ``next``."""

    def __init__(self, max_header: int = MAX_HEADER, max_body: int = MAX_BODY) -> None:
        self._buffer = bytearray()
        self._max_header = max_header
        self._max_body = max_body

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        self._buffer += data

    def next(self) -> tuple[dict[str, Any], bytes] | None:
        """Return the next whole frame, or ``None`` until more bytes arrive.

        Raises ``ProtocolError`` for an oversized or malformed frame; the stream
        cannot be resynchronised after that, so the caller must give up on it.
        """
        buffer = self._buffer
        if len(buffer) < PREFIX.size:
            return None
        head_len, body_len = PREFIX.unpack_from(buffer)
        if head_len > self._max_header:
            raise ProtocolError(f"frame header of {head_len} bytes exceeds {self._max_header}")
        if body_len > self._max_body:
            raise ProtocolError(f"frame body of {body_len} bytes exceeds {self._max_body}")
        end = PREFIX.size + head_len + body_len
        if len(buffer) < end:
            return None
        raw_head = bytes(buffer[PREFIX.size : PREFIX.size + head_len])
        body = bytes(buffer[PREFIX.size + head_len : end])
        del buffer[:end]
        try:
            header = _loads(raw_head.decode("utf-8", "surrogateescape"))
        except ValueError as exc:
            raise ProtocolError(f"frame header is not UTF-8 JSON: {exc}") from None
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise ProtocolError("frame header is not a JSON object with a string 'type'")
        return header, body


def count_chars(data: bytes) -> int:
    """Count the characters ``data`` shows as text: each UTF-8 character, and each byte
    that is not part of one (which a reader shows as a replacement character).

    Counting a stray byte as nothing would let output made only of UTF-8
    continuation bytes pass every character bound.
    """
    return len(data.decode("utf-8", "surrogateescape"))


def split_chars(data: bytes, chars: int) -> int:
    """Return how many leading bytes of ``data`` hold its first ``chars`` characters.

    Characters are counted as ``count_chars`` counts them; the cut never splits
    a valid UTF-8 character.
    """
    text = data.decode("utf-8", "surrogateescape")
    if len(text) <= chars:
        return len(data)
    if chars <= 0:
        return 0
    return len(text[:chars].encode("utf-8", "surrogateescape"))
