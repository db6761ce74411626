"""From response bytes to the text a model sees: bounded decoding, charsets, the wrapper.

All pure: the `Fetcher` feeds body chunks into a `BodyCollector` and hands
the result to `render`.
"""

from __future__ import annotations

import codecs
import re
import zlib

import attrs

from .._ground._webfailures import content_words
from .._ground._webwords import WARNING
from ..errors import ContentRefusal, ContentWhy
from ._html import html_to_text
from ._links import LinkStyle

__all__ = [
    "ACCEPT",
    "ACCEPT_ENCODING",
    "CLOSE_TAG",
    "BodyCollector",
    "ContentRefused",
    "Fenced",
    "fence",
    "neutralize",
    "parse_content_type",
    "render",
]

ACCEPT = (
    "text/html, application/xhtml+xml, text/plain;q=0.9, text/markdown;q=0.9, "
    "application/json;q=0.8, */*;q=0.1"
)
# Only what can be decompressed under a hard output bound with the standard library.
ACCEPT_ENCODING = "gzip, deflate"


_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {"text/plain", "text/markdown", "text/x-markdown", "application/json", "text/json"}
)
_META_CHARSET = re.compile(
    rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE
)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# A page could end the wrapper early by writing its closing tag (in any case, with spaces,
# or with look-alike angle brackets); every tag-shaped "web_content" loses its bracket.
_FENCE_TAG = re.compile(r"[<\uff1c\ufe64\u2039\u3008\u27e8]\s*/?\s*web_content", re.IGNORECASE)
# Invisible format characters (zero-width, bidi controls, Unicode "tag" characters) can hide
# instructions from a human reviewer while a model still reads them, and can split the fence
# name above; they carry nothing a reader needs, so they are removed.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000e0000-\U000e0fff]"
)


class ContentRefused(Exception):
    """The response is not something the web tools turn into text.

    ``refusal`` says why by code; the message is its words.
    """

    def __init__(self, refusal: ContentRefusal) -> None:
        super().__init__(content_words(refusal))
        self.refusal = refusal

    @classmethod
    def of(cls, why: ContentWhy, given: str, detail: str = "") -> ContentRefused:
        """The refusal of code ``why`` naming ``given`` (and ``detail``)."""
        return cls(ContentRefusal(why=why, given=given, detail=detail))


def parse_content_type(value: str | None) -> tuple[str, str | None]:
    """Split a Content-Type header into the lower-case media type and the charset, if any."""
    if not value:
        return "", None
    media, *params = value.split(";")
    charset = None
    for param in params:
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset":
            charset = val.strip().strip("\"'") or None
    return media.strip().lower(), charset


@attrs.define
class BodyCollector:
    """Collects a body under a byte limit, undoing gzip or deflate without exceeding it.

    Both the bytes received and the bytes produced by decompression count
    against ``limit``, so a small compressed bomb stops at the limit like a
    large plain body. ``truncated`` says whether anything was left unread.
    """

    limit: int
    encoding: str = ""
    received: int = 0
    truncated: bool = False
    _parts: list[bytes] = attrs.field(factory=list)
    _size: int = 0
    _inflater: zlib._Decompress | None = None
    _deflate_probe: bytes | None = None

    @classmethod
    def for_encoding(cls, header: str | None, limit: int) -> BodyCollector:
        """Prepare for a Content-Encoding; raise `ContentRefused` for one we do not undo."""
        codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1:
            raise ContentRefused.of(ContentWhy.COMPRESSED_TWICE, header or "")
        coding = codings[0] if codings else ""
        if coding in ("gzip", "x-gzip"):
            return cls(
                limit=limit, encoding="gzip", inflater=zlib.decompressobj(16 + zlib.MAX_WBITS)
            )
        if coding == "deflate":
            return cls(limit=limit, encoding="deflate", deflate_probe=b"")
        if coding:
            raise ContentRefused.of(ContentWhy.ENCODING, coding)
        return cls(limit=limit)

    @property
    def full(self) -> bool:
        """Whether the limit is reached and reading should stop."""
        return self.truncated or self._size >= self.limit

    def feed(self, data: bytes) -> None:
        """Add raw body bytes; stop (and mark truncated) when the limit is reached."""
        if self.full:
            self.truncated = True
            return
        self.received += len(data)
        if self.received > self.limit:
            self.truncated = True
            data = data[: len(data) - (self.received - self.limit)]
        if self._deflate_probe is not None:
            # "deflate" is zlib-wrapped by the standard, raw by some servers; look at the header.
            probe = self._deflate_probe + data
            if len(probe) < 2:
                self._deflate_probe = probe
                return
            wrapped = (probe[0] & 0x0F) == 8 and int.from_bytes(probe[:2], "big") % 31 == 0
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            self._deflate_probe = None
            data = probe
        if self._inflater is None:
            self._keep(data)
            return
        try:
            while data and self._size < self.limit:
                out = self._inflater.decompress(data, self.limit - self._size + 1)
                self._keep(out)
                data = self._inflater.unconsumed_tail
            if self._inflater.eof:
                return
        except zlib.error as error:
            raise ContentRefused.of(ContentWhy.CORRUPT, self.encoding, str(error)) from None

    def _keep(self, data: bytes) -> None:
        room = self.limit - self._size
        if len(data) > room:
            data = data[:room]
            self.truncated = True
        if data:
            self._parts.append(data)
            self._size += len(data)

    def body(self) -> bytes:
        """The decoded body bytes collected so far."""
        if self._deflate_probe:
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            probe, self._deflate_probe = self._deflate_probe, None
            self.feed(probe)
        return b"".join(self._parts)


def _decode(body: bytes, charset: str | None, media: str) -> str:
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body[len(bom) :].decode(name, errors="replace")
    if charset is None and media in _HTML_TYPES:
        match = _META_CHARSET.search(body[:4096])
        if match:
            charset = match.group(1).decode("ascii")
    if charset:
        try:
            codec = codecs.lookup(charset)
        except LookupError:
            codec = None
        if codec is not None:
            # A page declaring a charset it does not use still yields text, with U+FFFD marks.
            return body.decode(codec.name, errors="replace")
    if media in ("application/json", "text/json", "text/markdown", "text/x-markdown"):
        return body.decode("utf-8", errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        # Undeclared and not UTF-8: the web's historical default.
        return body.decode("windows-1252", errors="replace")


def _looks_binary(body: bytes) -> bool:
    sample = body[:8192]
    if not sample:
        return False
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False
    if b"\x00" in sample:
        return True
    controls = sum(1 for byte in sample if byte < 9 or 13 < byte < 32)
    return controls * 10 > len(sample)


def render(
    body: bytes,
    content_type: str | None,
    url: str,
    *,
    main_content: bool = False,
    links: LinkStyle = "inline",
) -> str:
    """Turn a body into readable text, or raise `ContentRefused` naming the type.

    ``main_content`` and ``links`` are `html_to_text`'s, for HTML.
    """
    media, charset = parse_content_type(content_type)
    if not media:
        head = body[:512].lstrip().lower()
        media = "text/html" if head.startswith((b"<!doctype html", b"<html")) else "text/plain"
    if media not in _HTML_TYPES and media not in _TEXT_TYPES and not media.endswith("+json"):
        raise ContentRefused.of(ContentWhy.NOT_TEXT, media)
    wide = (charset or "").lower().replace("_", "-").startswith(("utf-16", "utf-32"))
    if not wide and _looks_binary(body):
        raise ContentRefused.of(ContentWhy.BINARY, media)
    text = _decode(body, charset, media)
    if media in _HTML_TYPES:
        return html_to_text(text, url, main_content=main_content, links=links)
    return text.replace("\r\n", "\n")


def neutralize(text: str) -> str:
    """Remove invisible characters and defuse anything that could close or open the fence."""
    text = _INVISIBLE.sub("", text)
    return _FENCE_TAG.sub(lambda m: "&lt;" + m.group(0)[1:], text)


def _attribute(value: str) -> str:
    out = []
    for char in value:
        out.append(f"%{ord(char):02X}" if char in '"<>' or ord(char) < 0x20 else char)
    return "".join(out)


#: The tag that ends the fence; nothing inside it can write it (``neutralize``).
CLOSE_TAG = "</web_content>"


@attrs.frozen(kw_only=True)
class Fenced:
    """Untrusted text as its fields, before it is framed: the fence is built from them.

    ``inside`` is what the fence holds (our warning, then the text neutralized);
    ``head`` the lines before the opening tag and ``notes`` the lines after the
    closing one, each ours. A renderer that must cut the result cuts ``inside``
    alone and frames it again (``framed``): nothing ever reads the fence back
    out of the text.
    """

    source: str
    inside: str
    head: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, source: str, body: str, *, head: tuple[str, ...] = (), notes: tuple[str, ...] = ()
    ) -> Fenced:
        """``body`` (untrusted text from ``source``) fenced as the spec shows."""
        inside = f"{WARNING}\n{neutralize(body).strip(chr(10))}"
        return cls(source=source, inside=inside, head=head, notes=notes)

    def framed(self, inside: str, *, first_notes: tuple[str, ...] = ()) -> str:
        """``inside`` in this fence: the head, the fence, ``first_notes``, then the notes."""
        lines = [*self.head, f'<web_content source="{_attribute(self.source)}">', inside]
        return "\n".join([*lines, CLOSE_TAG, *first_notes, *self.notes])

    @property
    def text(self) -> str:
        """The whole fenced text, as a model reads it uncut."""
        return self.framed(self.inside)


def fence(source: str, body: str) -> str:
    """Wrap untrusted text as the spec shows, so it cannot end the wrapper early."""
    return Fenced.of(source, body).text
