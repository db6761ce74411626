"""How links reach the output: marker pieces in the converter's output, written out in a style.

The converter writes a `LINK_OPEN` piece where a link starts and a `LinkEnd`
carrying its target where it ends; `assemble` joins the pieces of the spans
that are kept and writes each link as the host's `LinkStyle` says, so the
numbering of references follows only the links the reader gets. A reference
to the page's own site is written from its path (``/a/b``), which the reader
resolves against the page's address (the fence's ``source``).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urljoin, urlsplit

__all__ = [
    "LINK_OPEN",
    "LINK_STYLES",
    "LinkEnd",
    "LinkStart",
    "LinkStyle",
    "assemble",
    "with_targets",
]

LinkStyle = Literal["references", "inline", "text"]
LINK_STYLES: tuple[LinkStyle, ...] = ("references", "inline", "text")


def with_targets(style: LinkStyle) -> LinkStyle:
    """The style a call asking for link targets gets: the host's, if it writes targets;
    numbered references (the fewest words that still give every target) if not."""
    return "references" if style == "text" else style


class LinkEnd(str):
    """The end of a link in the output, carrying its target as written in the page.

    The target is made absolute only when the link is written out: most links of a page
    are in the menus and boxes that main-content extraction leaves out.
    """

    __slots__ = ("href",)
    href: str

    def __new__(cls, href: str) -> LinkEnd:
        piece = super().__new__(cls, "")
        piece.href = href
        return piece


class LinkStart(str):
    """The start of a link in the output: a type of its own, so page text never passes for it."""

    __slots__ = ()


LINK_OPEN = LinkStart("[")


def assemble(
    pieces: list[str], spans: list[tuple[int, int]], links: LinkStyle, base_url: str
) -> tuple[str, list[tuple[int, str]]]:
    """Join the output pieces in ``spans``, writing each link as ``links`` says.

    Returns the text and the numbered targets for the references style.
    """
    numbers: dict[str, int] = {}
    origin = _origin(base_url)
    out: list[str] = []
    for start, end in spans:
        for piece in pieces[start:end]:
            if type(piece) is str:
                out.append(piece)
            elif links == "text":
                continue
            elif isinstance(piece, LinkEnd):
                url = urljoin(base_url, piece.href)
                if links == "inline":
                    out.append(f"]({url})")
                else:
                    url = _short(url, origin)
                    out.append(f"][{numbers.setdefault(url, len(numbers) + 1)}]")
            else:
                out.append("[")
    return "".join(out), [(number, url) for url, number in numbers.items()]


def _origin(base_url: str) -> str:
    """The page's scheme and host with the path's first slash (``https://ex.example/``)."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}/" if parts.scheme and parts.netloc else ""


def _short(url: str, origin: str) -> str:
    """``url`` from its path when it is on the page's site: the site's name costs the reader
    words in every reference and says nothing the page's address does not."""
    if not origin or not url.startswith(origin):
        return url
    rest = url[len(origin) :]
    # "https://site//other.example/x" would shorten to "//other.example/x", another site's URL.
    return url if rest.startswith(("/", "\\")) else "/" + rest
